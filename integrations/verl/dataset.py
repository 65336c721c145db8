"""``gem-core make-dataset verl``: the parquet verl's RL dataset reads, one row per episode to play.

Each row has what ``verl.utils.dataset.RLHFDataset`` needs (``data_source``, ``prompt`` as chat messages,
``reward_model``, ``extra_info.index``), ``agent_name="gem_env"`` so verl runs the gem_env agent loop on
it, and the env columns that loop reads (``env_id``, ``env_seed``, ``env_kwargs`` as JSON, ``env_tools``,
``max_turns``, ``max_turn_tokens``, ``max_context_tokens``, ``system_prompt``: :meth:`gem_core.tasks.TaskSpec.to_columns`).
``prompt`` holds the model's real first message for that seed (:meth:`~gem_core.tasks.TaskSpec.first_message`: the
observation and its suffix; verl filters and logs prompts by it); the agent loop resets the env with
the same seed and builds its own prompt tokens.

A vision env's row (its first observation carries images, e.g. ``vision:Geometry-v0``) is in verl's
multimodal form: the prompt's text holds one ``<image>`` per image, and an ``images`` column holds them in
that order as ``{"bytes": <PNG>}`` (what verl's ``RLHFDataset`` reads with its default
``data.image_key=images``; it needs the model's processor). The agent loop itself takes the images from
the env, reset with the row's seed. A text env's rows have no ``images`` column.
Imports no verl: only gem_core and pyarrow.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from typing import Any

from gem_core.cli_support import CliError, whole_number
from gem_core.dataset_rows import add_task_arguments, seed_arguments, task_arguments
from gem_core.multimodal import MultimodalObservation, image_png_bytes
from gem_core.tasks import specs_for
from gem_core.utils.files import write_whole

AGENT_NAME = "gem_env"


def dataset_rows(
    env_id: str,
    n: int,
    *,
    env_kwargs: dict[str, Any] | None = None,
    tools: Sequence[str] = (),
    max_turns: int | None = None,
    max_turn_tokens: int | None = None,
    max_context_tokens: int | None = None,
    split: str = "train",
    observation_prompt: bool = True,
    system_prompt: str | None = None,
    stop_after_box: bool = False,
    **seeds: Any,
) -> list[dict[str, Any]]:
    """``n`` rows for ``env_id``; ``seeds``: which seeds, :func:`gem_core.tasks.specs_for`'s keywords (``seed_start``
    and ``balanced``: consecutive seeds, or GuessTheNumber's targets equally often; or a run's start states:
    ``run_seed``, ``per_update``, ``seeds_below``); none: seeds ``0 .. n - 1``."""
    specs = specs_for(
        env_id,
        n,
        **seeds,
        env_kwargs=env_kwargs or {},
        tools=tuple(tools),
        max_turns=max_turns,
        max_turn_tokens=max_turn_tokens,
        max_context_tokens=max_context_tokens,
        system_prompt=system_prompt,
        stop_after_box=stop_after_box,
    )
    env = specs[0].make_env()  # fails early on an unknown id, bad kwargs or an unknown tool
    rows = []
    try:
        for i, spec in enumerate(specs):
            first = spec.first_observation(env) if observation_prompt else f"{env_id} (seed {spec.seed})"
            images = first.images if isinstance(first, MultimodalObservation) else ()
            text = first.text if isinstance(first, MultimodalObservation) else first
            messages = [{"role": "user", "content": text}]
            if spec.system_prompt:
                messages.insert(0, {"role": "system", "content": spec.system_prompt})
            row = {
                "data_source": env_id,
                "prompt": messages,
                "agent_name": AGENT_NAME,
                **spec.to_columns(),
                "reward_model": {"style": "env", "ground_truth": ""},
                "extra_info": {"index": i, "split": split, "env_seed": spec.seed},
            }
            if images:  # verl's multimodal row: one <image> in the text per image, in this order
                row["images"] = [{"bytes": image_png_bytes(image)} for image in images]
            rows.append(row)
    finally:
        env.close()
    return rows


def make_dataset(env_id: str, n: int, out: str, **kwargs: Any) -> str:
    """Write :func:`dataset_rows` to the parquet file ``out``; returns ``out``. The file appears whole or
    not at all (written beside it, then renamed); its directory must exist (it is not created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(dataset_rows(env_id, n, **kwargs))
    write_whole(out, lambda temporary: pq.write_table(table, temporary))
    return out


PYARROW_MISSING = (
    "make-dataset verl writes parquet, which needs pyarrow: install the verl extra in the clone "
    "(pip install -e '.[verl]'), or pyarrow alone (pip install 'pyarrow>=19')"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gem-core make-dataset verl``."""
    add_task_arguments(parser)
    parser.add_argument("--out", required=True, help="parquet file to write")
    parser.add_argument("--max-turn-tokens", type=whole_number(1), default=None, help="max tokens per response (default: rollout.response_length)")
    parser.add_argument(
        "--max-context-tokens", type=whole_number(1), default=None, help="max tokens of the whole episode (default: rollout.prompt_length + response_length)"
    )
    parser.add_argument("--split", default="train", help="extra_info.split (default train)")


def main(args: argparse.Namespace) -> int:
    """Run ``gem-core make-dataset verl`` with parsed ``args``."""
    if importlib.util.find_spec("pyarrow") is None:  # before any row is made
        raise CliError(PYARROW_MISSING)
    env_kwargs, tools = task_arguments(args)
    make_dataset(
        args.env,
        args.n,
        args.out,
        **seed_arguments(args),
        env_kwargs=env_kwargs,
        tools=tools,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_context_tokens=args.max_context_tokens,
        split=args.split,
        system_prompt=args.system_prompt,
        stop_after_box=args.stop_after_box,
    )
    print(f"wrote {args.n} rows of {args.env} to {args.out}")
    return 0
