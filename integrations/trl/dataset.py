"""Training datasets for TRL's ``GRPOTrainer``: one conversational prompt per episode, its task spec inside.

    gem-core make-dataset trl --env game:GuessTheNumber-v0-easy --n 256 --out prompts.jsonl
    dataset = datasets.load_dataset("json", data_files="prompts.jsonl", split="train")
    # or, in Python: make_dataset("game:GuessTheNumber-v0-easy", 256)

Each row is ``{"prompt": [{"role": "user", "content": <first message>, "gem_task": "<JSON task spec>"}]}``
(a system message first when the spec has one). TRL hands a ``rollout_func`` nothing but the prompts,
so the episode's :class:`gem_core.tasks.TaskSpec` travels inside the prompt's user message, under
:data:`TASK_KEY`; the rollout function (:mod:`gem_integrations.trl.rollout`) reads it back with
:func:`task_of`. The message's text is :meth:`~gem_core.tasks.TaskSpec.first_message` (what TRL logs as
the prompt); the context itself is built by the rollout from the env's own reset, as every plugin does.
TRL repeats each row ``num_generations`` times, so every completion of a prompt starts from one state.
Row ``i`` gets seed ``seed_start + i``. Needs only gem_core (and ``datasets`` for :func:`make_dataset`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import gem_core
from gem_core.tasks import TaskSpec, add_jsonl_dataset_arguments, row_fields, specs_for, write_jsonl

TASK_KEY = "gem_task"


def prompt_of(spec: TaskSpec, env: Any = None) -> list[dict[str, Any]]:
    """The conversational prompt of one row: ``[system?, user]``, the user message carrying the spec."""
    messages: list[dict[str, Any]] = []
    if spec.system_prompt is not None:
        messages.append({"role": "system", "content": spec.system_prompt, TASK_KEY: None})
    messages.append({"role": "user", "content": spec.first_message(env), TASK_KEY: spec.to_json()})
    return messages


def task_of(prompt: Any) -> TaskSpec:
    """The task spec a row's prompt carries (see the module docstring); a clear error otherwise."""
    if isinstance(prompt, Mapping):
        prompt = [prompt]
    if isinstance(prompt, (list, tuple)):
        for message in prompt:
            if isinstance(message, Mapping) and message.get(TASK_KEY):
                return TaskSpec.from_json(message[TASK_KEY])
    raise ValueError(
        f"this prompt carries no gem-core task spec (a message with a {TASK_KEY!r} key); build the dataset with "
        f"gem_integrations.trl.make_dataset or `gem-core make-dataset trl`. Got {str(prompt)[:200]!r}"
    )


def rows_for(specs: Iterable[TaskSpec]) -> Iterator[dict[str, Any]]:
    """One row per spec (an env per env id is made once and reset for each row)."""
    envs: dict[tuple, Any] = {}
    try:
        for spec in specs:
            key = (spec.env_id, json.dumps(spec.env_kwargs, sort_keys=True), spec.tools)
            if key not in envs:
                envs[key] = spec.make_env()  # unknown ids, kwargs and tools fail here
            yield {"prompt": prompt_of(spec, envs[key])}
    finally:
        for env in envs.values():
            env.close()


def rows(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> list[dict[str, Any]]:
    """Rows for ``n`` episodes of ``env_id`` (seeds ``seed_start ..``); ``fields``: the other
    :class:`~gem_core.tasks.TaskSpec` fields."""
    env_id = gem_core.spec(env_id).id  # unknown ids fail before anything is made
    return list(rows_for(specs_for(env_id, n, seed_start=seed_start, **fields)))


def make_dataset(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Any:
    """A ``datasets.Dataset`` of :func:`rows` (the ``train_dataset`` of ``GRPOTrainer``)."""
    from datasets import Dataset

    return Dataset.from_list(rows(env_id, n, seed_start=seed_start, **fields))


def write_dataset(out: str | Path, env_id: str, n: int, **kwargs: Any) -> int:
    """Write :func:`rows` as JSONL, whole or not at all (:func:`gem_core.tasks.write_jsonl`); returns the
    number of rows. Its directory must exist (it is not created)."""
    return write_jsonl(out, rows(env_id, n, **kwargs))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset trl``."""
    add_jsonl_dataset_arguments(
        parser,
        out_help="JSONL file to write (datasets.load_dataset('json', data_files=...))",
        turn_tokens_help="max tokens per response (default: TRL's max_completion_length)",
        context_tokens_help="max tokens of the whole episode, prompt included",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset trl`` with parsed ``args``."""
    count = write_dataset(args.out, args.env, args.n, **row_fields(args))
    print(f"wrote {count} prompts to {args.out}  (train_dataset=datasets.load_dataset('json', data_files='{args.out}', split='train'))")
    return 0
