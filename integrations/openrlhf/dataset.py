"""Prompt datasets for OpenRLHF: one JSONL row per prompt, the env spec in the label.

    gem-core make-dataset openrlhf --env game:GuessTheNumber-v0-easy --n 256 --out prompts.jsonl

Each row is ``{"prompt": <the model's first message>, "label": "<JSON task spec>"}`` (the prompt is
:meth:`gem_core.tasks.TaskSpec.first_message`: the observation and its suffix); train with
``--data.prompt_dataset prompts.jsonl --data.input_key prompt --data.label_key label`` (no
``--data.apply_chat_template``: the GEM agent renders the env's own observation itself). The label
``{"env_id", "seed", "env_kwargs", "tools"}`` is what :mod:`gem_integrations.openrlhf.agent` reads; every sample
of a prompt shares it, so a group of ``n_samples_per_prompt`` starts from one state. Row ``i`` gets
seed ``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gem_core
from gem_core.tasks import TaskSpec, add_task_arguments, parse_tools, specs_for, task_arguments


def label_for(env_id: str, seed: int | None, env_kwargs: dict[str, Any] | None = None, **extra: Any) -> str:
    """The label JSON of one prompt row (:meth:`gem_core.tasks.TaskSpec.to_json`)."""
    return TaskSpec(env_id, seed=seed, env_kwargs=dict(env_kwargs or {}), **{k: v for k, v in extra.items() if v is not None}).to_json()


def rows(
    env_id: str,
    n: int,
    seed_start: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    tools: Sequence[str] = (),
) -> Iterator[dict[str, str]]:
    """Rows for ``n`` episodes of ``env_id`` (the env is made once and reset for each prompt)."""
    env_id = gem_core.spec(env_id).id  # unknown ids fail here, before anything is written
    specs = specs_for(env_id, n, seed_start=seed_start, env_kwargs=env_kwargs or {}, tools=tuple(parse_tools(tools)), max_turns=max_turns)
    env = specs[0].make_env()  # unknown tools and kwargs too
    try:
        for spec in specs:
            yield {"prompt": spec.first_message(env), "label": spec.to_json()}
    finally:
        env.close()


def write_dataset(
    out: str | Path,
    env_id: str,
    n: int,
    seed_start: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    tools: Sequence[str] = (),
) -> int:
    """Write the JSONL file; returns the number of rows."""
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for row in rows(env_id, n, seed_start, env_kwargs, max_turns, tools):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset openrlhf``."""
    add_task_arguments(parser)
    parser.add_argument("--out", required=True, help="JSONL file to write")


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset openrlhf`` with parsed ``args``."""
    env_kwargs, tools = task_arguments(args)
    count = write_dataset(args.out, args.env, args.n, args.seed_start, env_kwargs, args.max_turns, tools)
    print(f"wrote {count} prompts to {args.out}  (--data.input_key prompt --data.label_key label)")
    return 0
