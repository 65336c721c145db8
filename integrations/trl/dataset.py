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

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gem_core.dataset_rows import JsonlDataset, task_rows
from gem_core.tasks import TaskSpec

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


def rows_for(specs: Iterable[TaskSpec]) -> Iterator[Mapping[str, Any]]:
    """One row per spec (an env per env id, kwargs and tools is made once and reset for each row)."""
    return task_rows(specs, lambda spec, env: {"prompt": prompt_of(spec, env)})


DATASET = JsonlDataset(
    row_of=lambda spec, env: {"prompt": prompt_of(spec, env)},
    out_help="JSONL file to write (datasets.load_dataset('json', data_files=...))",
    turn_tokens_help="max tokens per response (default: TRL's max_completion_length)",
    context_tokens_help="max tokens of the whole episode, prompt included",
    next_step=lambda out: f"train_dataset=datasets.load_dataset('json', data_files='{out}', split='train')",
    unit="prompts",
)
write_dataset, add_arguments, main = DATASET.write, DATASET.add_arguments, DATASET.main


def rows(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> list[Mapping[str, Any]]:
    """Rows for ``n`` episodes of ``env_id`` (seeds ``seed_start ..``); ``fields``: the other
    :class:`~gem_core.tasks.TaskSpec` fields."""
    return list(DATASET.rows(env_id, n, seed_start=seed_start, **fields))


def make_dataset(env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Any:
    """A ``datasets.Dataset`` of :func:`rows` (the ``train_dataset`` of ``GRPOTrainer``)."""
    from datasets import Dataset

    return Dataset.from_list(rows(env_id, n, seed_start=seed_start, **fields))
