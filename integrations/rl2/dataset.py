"""Datasets for RL2: one JSONL row per episode, the task spec in ``extra_info``.

    gem-core make-dataset rl2 --env game:GuessTheNumber-v0-easy --n 256 --out train.jsonl

Each row is ``{"extra_info": {"gem_task": "<JSON task spec>"}}`` (:meth:`gem_core.tasks.TaskSpec.to_json`).
No ``prompt`` or ``messages`` column, on purpose: RL2 0.0.2's rollout then calls the env module's
``reset(extra_info)``, which starts the episode; RL2 HEAD hands the row to ``generate`` as
``sample.sample``. Every response of a row (``responses_per_prompt``) starts from the same state. Row
``i`` gets seed ``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

from gem_core.dataset_rows import JsonlDataset
from gem_integrations.rl2.rollout import TASK_KEY

DATASET = JsonlDataset(
    row_of=lambda spec, env: {"extra_info": {TASK_KEY: spec.to_json()}},
    out_help="JSONL file to write",
    turn_tokens_help="max tokens per response (default: RL2's max_new_tokens)",
    context_tokens_help="max tokens of the whole episode (default: none)",
    next_step=lambda out: f"train_data.path={out} rollout.env_path=$(gem-core rl2 env-path)",
)
rows, write_dataset, add_arguments, main = DATASET.rows, DATASET.write, DATASET.add_arguments, DATASET.main
