"""Datasets for oat's GEM actor: one JSONL row per episode, ``{"gem_task": "<JSON task spec>"}``.

    gem-core make-dataset oat --env game:GuessTheNumber-v0-easy --n 1024 --out train.jsonl

The actor (``--gem-dataset train.jsonl``) plays the rows in order, cycling. Row ``i`` gets seed
``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gem_core
from gem_core.tasks import TaskSpec, add_jsonl_dataset_arguments, row_fields, specs_for, write_jsonl

TASK_KEY = "gem_task"


def rows(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Iterator[dict[str, Any]]:
    """Rows for ``n`` episodes of ``env_id``; ``fields``: the other :class:`~gem_core.tasks.TaskSpec` fields."""
    env_id = gem_core.spec(env_id).id  # unknown ids fail here, before anything is written
    specs = specs_for(env_id, n, seed_start=seed_start, **fields)
    specs[0].make_env().close()  # unknown tools and kwargs too
    for spec in specs:
        yield {TASK_KEY: spec.to_json()}


def read_specs(path: str | Path) -> list[TaskSpec]:
    """The task specs of a file written by :func:`write_dataset` (a bad row is one ValueError naming its line)."""
    specs = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                specs.append(TaskSpec.from_json(json.loads(line)[TASK_KEY]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a gem-core oat row ({exc})") from None
    if not specs:
        raise ValueError(f"{path}: no rows")
    return specs


def write_dataset(out: str | Path, env_id: str, n: int, **kwargs: Any) -> int:
    """Write the JSONL file of :func:`rows` (whole or not at all); returns the number of rows."""
    return write_jsonl(out, rows(env_id, n, **kwargs))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset oat``."""
    add_jsonl_dataset_arguments(
        parser, out_help="JSONL file to write", turn_tokens_help="max tokens per response (default: oat's --generate-max-length)", context_tokens_help="max tokens of the whole episode (default: none)"
    )


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset oat`` with parsed ``args``."""
    count = write_dataset(args.out, args.env, args.n, **row_fields(args))
    print(f"wrote {count} rows to {args.out}  (python -m gem_integrations.oat.launch --gem-dataset {args.out} ...)")
    return 0
