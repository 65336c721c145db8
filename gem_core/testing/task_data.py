"""Small local copies of every task id's dataset, made by gem_core, for tests and offline smoke runs.

:func:`write_task_data` writes, under a folder, ``<owner>__<name>/<split>.jsonl`` for each hub dataset
that a registered task id names (the layout :mod:`gem_core.envs.datasets` reads from
``$GEM_DATA_DIR``): generated math problems with known answers for math ids and math evaluation sets,
and (as those categories land) generated rows for the others. Point ``GEM_DATA_DIR`` at the folder
and every id makes without a network.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gem_core
from gem_core.envs.datasets import GENERATED


def _math_rows(n: int, seed: int) -> list[dict[str, Any]]:
    from gem_core.envs.math_data import generate_math_rows

    return generate_math_rows(n, seed)


def _qa_rows(n: int, seed: int) -> list[dict[str, Any]]:
    from gem_core.envs.qa_data import qa_rows

    return qa_rows(max(1, n // 3), seed)[:n]


def _ruletaker_rows(n: int, seed: int) -> list[dict[str, Any]]:
    from gem_core.envs.logic.ruletaker import GeneratedRows

    rows = GeneratedRows(depth=seed % 4, seed=seed)
    return [rows[i] for i in range(n)]


def _code_rows(n: int, seed: int) -> list[dict[str, Any]]:
    from gem_core.envs.code_data import code_rows

    return code_rows(n)


#: entry point -> a function (n, seed) -> rows with the fields the id reads by default.
ROW_MAKERS: dict[str, Callable[[int, int], list[dict[str, Any]]]] = {
    "gem_core.envs.math_env:MathEnv": _math_rows,
    "gem_core.envs.math_env:MathEvalSet": _math_rows,
    "gem_core.envs.qa_env:QaEnv": _qa_rows,
    "gem_core.envs.qa_env:QaEvalSet": _qa_rows,
    "gem_core.envs.logic.ruletaker:RuleTakerEnv": _ruletaker_rows,
    "gem_core.envs.code_env:CodeEnv": _code_rows,
    "gem_core.envs.code_env:CodeEvalSet": _code_rows,
}


def write_task_data(root: str | Path, rows_per_split: int = 8) -> dict[str, Path]:
    """Write a small copy of each registered task id's dataset under ``root``; returns id -> file."""
    root = Path(root)
    written: dict[str, Path] = {}
    for index, env_id in enumerate(gem_core.list_envs()):
        spec = gem_core.spec(env_id)
        maker = ROW_MAKERS.get(str(spec.entry_point))
        name = spec.kwargs.get("dataset_name")
        if maker is None or not name or name in GENERATED:
            continue
        split = spec.kwargs.get("split", "train")
        path = root / name.replace("/", "__") / f"{split}.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as handle:
                for row in maker(rows_per_split, index):
                    handle.write(json.dumps(row) + "\n")
        written[env_id] = path
    return written


#: The rg:* ids the generic per-id tests (properties, contract, env checker) run: reasoning-gym's 105
#: datasets share one env class, and tests/envs/test_reasoning_gym.py resets and scores every one of them.
RG_SAMPLE = ("rg:letter_counting", "rg:basic_arithmetic", "rg:propositional_logic", "rg:rush_hour")


def generic_test_ids(ids: list[str]) -> list[str]:
    """``ids`` with the rg:* ids cut down to :data:`RG_SAMPLE` (see there)."""
    return [i for i in ids if not i.startswith("rg:") or i in RG_SAMPLE]
