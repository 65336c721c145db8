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

A vision env's row (e.g. ``--env vision:Geometry-v0``) also has ``"images"``: its first observation's
images as PNG data URLs (``data:image/png;base64,...``, which OpenRLHF's ``load_images`` decodes), in the
order of the ``<image>`` placeholders in its prompt, for OpenRLHF's ``--data.image_key images`` (the
default). Train those with a vision-language model and ``--data.max_images_per_prompt`` (see
:mod:`gem_integrations.openrlhf.rollout`). Text rows have no ``images`` key.
"""

from __future__ import annotations

from typing import Any

from gem_core.core import Env
from gem_core.dataset_rows import JsonlDataset
from gem_core.multimodal import MultimodalObservation, image_data_url
from gem_core.tasks import TaskSpec

IMAGE_KEY = "images"


def row_of(spec: TaskSpec, env: Env) -> dict[str, Any]:
    """One prompt row: the first message, the label, and for a vision env the images."""
    first = spec.first_observation(env)
    if not isinstance(first, MultimodalObservation):
        return {"prompt": first, "label": spec.to_json()}
    return {"prompt": first.text, "label": spec.to_json(), IMAGE_KEY: [image_data_url(image) for image in first.images]}


DATASET = JsonlDataset(
    row_of=row_of,
    out_help="JSONL file to write",
    turn_tokens_help="max tokens per response (default: the agent's, see rollout.py)",
    context_tokens_help="max tokens of the whole episode (default: --data.max_len)",
    next_step=lambda out: "--data.input_key prompt --data.label_key label",
    unit="prompts",
    images=True,  # an images column OpenRLHF's PromptDataset reads (--data.image_key images)
)
rows, write_dataset, add_arguments, main = DATASET.rows, DATASET.write, DATASET.add_arguments, DATASET.main
