"""Prompt datasets for OpenRLHF: one JSONL row per prompt, the episode's task spec in the label.

    gem-core make-dataset openrlhf --env game:GuessTheNumber-v0-easy --n 256 --out prompts.jsonl

Each row is ``{"prompt": <the model's first message>, "label": "<JSON task spec>"}``: the prompt is
:meth:`gem_core.tasks.TaskSpec.first_message` (the observation and its suffix), the label
:meth:`gem_core.tasks.TaskSpec.to_json` (env id, seed, env kwargs, tools, and the optional limits
``max_turns``/``max_turn_tokens``/``max_context_tokens`` and ``system_prompt``), which the agent file
(:mod:`gem_integrations.openrlhf.agent`) reads back with ``TaskSpec.from_json``. Train with
``--data.prompt_dataset prompts.jsonl --data.input_key prompt --data.label_key label`` (no
``--data.apply_chat_template``: the agent renders the env's own first message itself). Every sample of
a prompt shares its label, so a group of ``n_samples_per_prompt`` starts from one state. Row ``i`` gets
seed ``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gem_core
from gem_core.tasks import add_jsonl_dataset_arguments, row_fields, specs_for, write_jsonl


def rows(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Iterator[dict[str, str]]:
    """Rows for ``n`` episodes of ``env_id``; ``fields``: the other :class:`~gem_core.tasks.TaskSpec`
    fields (one env is made, and reset for each prompt)."""
    env_id = gem_core.spec(env_id).id  # unknown ids fail here, before anything is written
    specs = specs_for(env_id, n, seed_start=seed_start, **fields)
    env = specs[0].make_env()  # unknown tools and kwargs too
    try:
        for spec in specs:
            yield {"prompt": spec.first_message(env), "label": spec.to_json()}
    finally:
        env.close()


def write_dataset(out: str | Path, env_id: str, n: int, **kwargs: Any) -> int:
    """Write the JSONL file of :func:`rows`; returns the number of rows. The file appears whole or not
    at all (:func:`gem_core.tasks.write_jsonl`); its directory must exist (it is not created)."""
    return write_jsonl(out, rows(env_id, n, **kwargs))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset openrlhf``."""
    add_jsonl_dataset_arguments(
        parser,
        out_help="JSONL file to write",
        turn_tokens_help="max tokens per response (default: the agent's, see agent.py)",
        context_tokens_help="max tokens of the whole episode (default: --data.max_len)",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset openrlhf`` with parsed ``args``."""
    count = write_dataset(args.out, args.env, args.n, **row_fields(args))
    print(f"wrote {count} prompts to {args.out}  (--data.input_key prompt --data.label_key label)")
    return 0
