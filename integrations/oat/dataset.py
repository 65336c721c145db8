"""Datasets for oat's GEM actor: one JSONL row per episode, ``{"gem_task": "<JSON task spec>"}``.

    gem-core make-dataset oat --env game:GuessTheNumber-v0-easy --n 1024 --out train.jsonl

The actor (``--gem-dataset train.jsonl``) plays the rows in order, cycling. Row ``i`` gets seed
``seed_start + i``. oat's learner loops over a prompt dataset, one batch per actor step:
:func:`prepare_learner_data` gives it :class:`StepPrompts` sized from the rows (oat's own default,
``--prompt-data``, is a TL;DR set downloaded from the hub). Needs only gem_core.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gem_core.dataset_rows import JsonlDataset
from gem_core.tasks import TaskSpec

TASK_KEY = "gem_task"


DATASET = JsonlDataset(
    row_of=lambda spec, env: {TASK_KEY: spec.to_json()},
    out_help="JSONL file to write",
    turn_tokens_help="max tokens per response (default: oat's --generate-max-length)",
    context_tokens_help="max tokens of the whole episode (default: none)",
    next_step=lambda out: f"python -m gem_integrations.oat.launch --gem-dataset {out} ...",
)
rows, write_dataset, add_arguments, main = DATASET.rows, DATASET.write, DATASET.add_arguments, DATASET.main


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


class StepPrompts:
    """oat's prompt dataset for the GEM actor: ``size`` empty ``(prompt, formatted prompt, reference)``
    items. oat's learner takes one batch of them per actor step; ``PPOMultiTurnActor.step`` ignores them."""

    def __init__(self, size: int):
        self.size = int(size)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[str, str, str]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return "", "", ""


def learner_prompts(args: Any, world_size: int) -> StepPrompts:
    """Prompts for one epoch of oat's loop (``--num-prompt-epoch`` counts them): ``ceil(rows /
    gem_episodes_per_step)`` steps, so that each actor plays every row of ``--gem-dataset`` once (each
    actor cycles through all rows; ``--gem-env``: ``--max-train`` episodes), each step a batch of
    ``rollout_batch_size_per_device`` on each of ``world_size`` learners (oat's DistributedSampler splits them)."""
    episodes = len(read_specs(args.gem_dataset)) if args.gem_dataset else int(args.max_train)
    steps = max(1, math.ceil(episodes / int(args.gem_episodes_per_step)))
    return StepPrompts(steps * int(world_size) * int(args.rollout_batch_size_per_device))


def prepare_learner_data(learner: Any, strategy: Any) -> None:
    """What oat's ``LearnerBase.prepare_data`` sets, from the GEM rows instead of oat's ``--prompt-data``
    (for ``GemLearner.prepare_data``); no prompt evaluation (the launcher sets ``--eval-steps -1``)."""
    learner.prompts_dataset = learner_prompts(strategy.args, strategy.world_size)
    learner.prompts_dataloader = strategy.setup_dataloader(learner.prompts_dataset, strategy.args.rollout_batch_size_per_device, shuffle=False)
    learner.eval_prompts_dataset = StepPrompts(1)  # oat's _init prints the train set's first item only
    learner.eval_prompts_dataloader = ()
