"""Datasets for RL2: one JSONL row per episode, the task spec in ``extra_info``.

    gem-core make-dataset rl2 --env game:GuessTheNumber-v0-easy --n 256 --out train.jsonl

Each row is ``{"extra_info": {"gem_task": "<JSON task spec>"}}`` (:meth:`gem_core.tasks.TaskSpec.to_json`).
No ``prompt`` or ``messages`` column, on purpose: RL2 0.0.2's rollout then calls the env module's
``reset(extra_info)``, which starts the episode; RL2 HEAD hands the row to ``generate`` as
``sample.sample``. Every response of a row (``responses_per_prompt``) starts from the same state. Row
``i`` gets seed ``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gem_core
from gem_core.tasks import add_jsonl_dataset_arguments, row_fields, specs_for, write_jsonl
from gem_integrations.rl2.rollout import TASK_KEY


def rows(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Iterator[dict[str, Any]]:
    """Rows for ``n`` episodes of ``env_id``; ``fields``: the other :class:`~gem_core.tasks.TaskSpec` fields."""
    env_id = gem_core.spec(env_id).id  # unknown ids fail here, before anything is written
    specs = specs_for(env_id, n, seed_start=seed_start, **fields)
    specs[0].make_env().close()  # unknown tools and kwargs too
    for spec in specs:
        yield {"extra_info": {TASK_KEY: spec.to_json()}}


def write_dataset(out: str | Path, env_id: str, n: int, **kwargs: Any) -> int:
    """Write the JSONL file of :func:`rows` (whole or not at all); returns the number of rows."""
    return write_jsonl(out, rows(env_id, n, **kwargs))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset rl2``."""
    add_jsonl_dataset_arguments(
        parser,
        out_help="JSONL file to write",
        turn_tokens_help="max tokens per response (default: RL2's max_new_tokens)",
        context_tokens_help="max tokens of the whole episode (default: none)",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset rl2`` with parsed ``args``."""
    count = write_dataset(args.out, args.env, args.n, **row_fields(args))
    print(f"wrote {count} rows to {args.out}  (train_data.path={args.out} rollout.env_path=$(gem-core rl2 env-path))")
    return 0
