"""Prompt datasets for OpenRLHF: one JSONL row per prompt, the episode's task spec in the label.

    gem-core make-dataset openrlhf --env game:GuessTheNumber-v0-easy --n 256 --out prompts.jsonl

Each row is ``{"prompt": <the model's first message>, "label": "<JSON task spec>"}``: the prompt is
:meth:`gem_core.tasks.TaskSpec.first_message` (the observation and its suffix), the label
:meth:`gem_core.tasks.TaskSpec.to_json` (env id, seed, env kwargs, tools, and the optional limits
``max_turns``/``max_turn_tokens``/``max_context_tokens`` and ``system_prompt``), which the agent file
(:mod:`gem_integrations.openrlhf.rollout`) reads back with ``TaskSpec.from_json``. Train with
``--data.prompt_dataset prompts.jsonl --data.input_key prompt --data.label_key label`` (no
``--data.apply_chat_template``: the agent renders the env's own first message itself). Every sample of
a prompt shares its label, so a group of ``n_samples_per_prompt`` starts from one state. Row ``i`` gets
seed ``seed_start + i``. Needs only gem_core.
"""

from __future__ import annotations

from gem_core.dataset_rows import JsonlDataset

DATASET = JsonlDataset(
    row_of=lambda spec, env: {"prompt": spec.first_message(env), "label": spec.to_json()},
    out_help="JSONL file to write",
    turn_tokens_help="max tokens per response (default: the agent's, see rollout.py)",
    context_tokens_help="max tokens of the whole episode (default: --data.max_len)",
    next_step=lambda out: "--data.input_key prompt --data.label_key label",
    unit="prompts",
)
rows, write_dataset, add_arguments, main = DATASET.rows, DATASET.write, DATASET.add_arguments, DATASET.main
