"""What every ``gem-core make-dataset TRAINER`` shares: the options, the rows of task specs, one JSONL writer.

A trainer's dataset is one row per episode, each row a :class:`~gem_core.tasks.TaskSpec` in the trainer's
own format. A plugin says only how one spec becomes one row (``row_of(spec, env)``: the env is made from
the spec, to reset for the first message, and shared by the rows of one env id, kwargs and tools) and how
its options are worded; :class:`JsonlDataset` does the rest: the options, checking them, the rows, writing
the file whole or not at all, and the line printed after.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gem_core.cli_support import whole_number
from gem_core.core import Env
from gem_core.errors import InvalidArgumentError
from gem_core.experiment import EVAL_SEED_START
from gem_core.multimodal import observation_images
from gem_core.registry import spec as registered_spec
from gem_core.tasks import TaskSpec, parse_env_kwargs, specs_for
from gem_core.tools.factory import parse_tools
from gem_core.utils.files import write_whole

#: One row of a trainer's dataset from a spec and an env made from it (reset it for the first message).
RowOf = Callable[[TaskSpec, Env], Mapping[str, Any]]


def task_rows(specs: Iterable[TaskSpec], row_of: RowOf) -> Iterator[Mapping[str, Any]]:
    """``row_of(spec, env)`` for each spec; an env is made once per env id, kwargs and tools (unknown
    ids, kwargs and tools fail there, before that row) and closed at the end."""
    envs: dict[tuple, Env] = {}
    try:
        for spec in specs:
            key = (spec.env_id, json.dumps(spec.env_kwargs, sort_keys=True), spec.tools)
            if key not in envs:
                envs[key] = spec.make_env()
            yield row_of(spec, envs[key])
    finally:
        for env in envs.values():
            env.close()


def env_rows(env_id: str, n: int, row_of: RowOf, *, seed_start: int = 0, **fields: Any) -> Iterator[Mapping[str, Any]]:
    """The rows of ``n`` episodes of ``env_id``, seeds ``seed_start ..``; ``fields``: the other TaskSpec
    fields. An unknown id fails here, before any row is made."""
    env_id = registered_spec(env_id).id
    return task_rows(specs_for(env_id, n, seed_start=seed_start, **fields), row_of)


def write_jsonl(out: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write ``rows`` as JSON lines; returns how many. The file appears whole or not at all (written
    beside it, then renamed); its directory must exist (it is not created)."""

    def write(temporary: str) -> int:
        count = 0
        with open(temporary, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
        return count

    return write_whole(out, write)


# -- the options -------------------------------------------------------------------------------------


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every ``gem-core make-dataset TRAINER`` shares: which env, how many rows, from which seed."""
    parser.add_argument("--env", required=True, help="env id, e.g. game:Sudoku-v0-easy")
    parser.add_argument("--n", type=whole_number(1), required=True, help="rows to write (one episode each)")
    parser.add_argument("--seed-start", type=whole_number(0), default=0, help="seed of the first row (default 0); row i gets seed-start + i")
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="GuessTheNumber with a fixed range: the first seeds from --seed-start whose targets are every number equally often "
        "(gem-core train's held-out set: --seed-start 1000000 --n 200); other envs: consecutive seeds as without it",
    )
    parser.add_argument(
        "--run-seed",
        type=whole_number(0),
        default=None,
        help="the rows are the start states gem-core train --seed RUN_SEED plays, update after update, --per-update of them "
        "an update (what an experiment's training rows are: the same seed, the same start states in every trainer)",
    )
    parser.add_argument("--per-update", type=whole_number(1), default=None, help="with --run-seed: start states (groups) an update")
    parser.add_argument(
        "--seeds-below",
        type=whole_number(1),
        default=EVAL_SEED_START,
        help=f"with --run-seed: the start states are drawn below this seed, the first held-out one (default {EVAL_SEED_START})",
    )
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of make() kwargs, e.g. '{\"max_turns\": 20}'")
    parser.add_argument("--tools", default="", help="comma-separated tools to wrap the env with: python, search")
    parser.add_argument("--max-turns", type=whole_number(1), default=None, help="turn limit on top of the env's own")
    parser.add_argument("--system-prompt", default=None, help="system message of every episode")
    parser.add_argument(
        "--stop-after-box",
        action="store_true",
        help="each response of every episode ends at the token that closes its \\boxed{...} move (the rows carry it; every trainer's rollout stops there)",
    )


def task_arguments(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """``(env_kwargs, tools)`` from the parsed shared options, validated (clear ValueErrors)."""
    return parse_env_kwargs(args.env_kwargs), parse_tools(args.tools)


def seed_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """Which seeds the rows get, from the parsed shared options (:func:`gem_core.tasks.specs_for`'s keywords):
    ``--seed-start`` (and ``--balanced``), or ``--run-seed`` with ``--per-update``; a mix is one clear ValueError."""
    if args.run_seed is None:
        if args.per_update is not None or args.seeds_below != EVAL_SEED_START:
            raise ValueError("--per-update and --seeds-below go with --run-seed")
        return {"seed_start": args.seed_start, "balanced": args.balanced}
    if args.seed_start or args.balanced:
        raise ValueError("--run-seed draws the rows' seeds itself: give it without --seed-start or --balanced")
    if args.per_update is None:
        raise ValueError("--run-seed needs --per-update: the start states (groups) of one update")
    return {"run_seed": args.run_seed, "per_update": args.per_update, "seeds_below": args.seeds_below}


def row_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The TaskSpec fields and ``seed_start`` from the options of a :class:`JsonlDataset` (validated:
    clear ValueErrors)."""
    env_kwargs, tools = task_arguments(args)
    return {
        **seed_arguments(args), "env_kwargs": env_kwargs, "tools": tuple(tools), "max_turns": args.max_turns,
        "max_turn_tokens": args.max_turn_tokens, "max_context_tokens": args.max_context_tokens, "system_prompt": args.system_prompt,
        "stop_after_box": args.stop_after_box,
    }  # fmt: skip


@dataclass(frozen=True)
class JsonlDataset:
    """One trainer's JSONL dataset: ``row_of`` makes a row; the rest is the same for every trainer.

    ``out_help``, ``turn_tokens_help``, ``context_tokens_help``: the options' help, in the trainer's words
    (where its own defaults come from). ``next_step(out)``: what to pass the trainer, printed after
    ``wrote N rows to OUT`` (``unit``: what the trainer calls a row). ``images``: whether the plugin's rows
    and rollout carry images; without, an env that shows images is refused in one line before a row is written."""

    row_of: RowOf
    out_help: str
    turn_tokens_help: str
    context_tokens_help: str
    next_step: Callable[[str], str]
    unit: str = "rows"
    images: bool = False

    def rows(self, env_id: str, n: int, *, seed_start: int = 0, **fields: Any) -> Iterator[Mapping[str, Any]]:
        """Rows for ``n`` episodes of ``env_id``; ``fields``: the other :class:`~gem_core.tasks.TaskSpec` fields."""
        if not self.images and n > 0:
            first = next(iter(specs_for(env_id, 1, seed_start=seed_start, **fields)))
            if observation_images(first.first_observation()):
                raise InvalidArgumentError(
                    f"{env_id} shows images, and this trainer's plugin plays text envs only (make-dataset verl or openrlhf carry images)"
                )
        return env_rows(env_id, n, self.row_of, seed_start=seed_start, **fields)

    def write(self, out: str | os.PathLike, env_id: str, n: int, **kwargs: Any) -> int:
        """Write the rows to the JSONL file ``out`` (whole or not at all); returns the number of rows."""
        return write_jsonl(out, self.rows(env_id, n, **kwargs))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The options of ``gem-core make-dataset TRAINER``: the shared ones, ``--out`` and the token limits."""
        add_task_arguments(parser)
        parser.add_argument("--out", required=True, help=self.out_help)
        parser.add_argument("--max-turn-tokens", type=whole_number(1), default=None, help=self.turn_tokens_help)
        parser.add_argument("--max-context-tokens", type=whole_number(1), default=None, help=self.context_tokens_help)

    def main(self, args: argparse.Namespace) -> int:
        """Run ``gem-core make-dataset TRAINER`` with parsed ``args``."""
        count = self.write(args.out, args.env, args.n, **row_fields(args))
        print(f"wrote {count} {self.unit} to {args.out}  ({self.next_step(args.out)})")
        return 0
