"""Graders shared by the task envs: math (math-verify in a bounded worker pool), QA (SQuAD exact match
and F1), code (tests in the shared Python sandbox). Imported lazily by the envs that use them."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "grade_math": "gem_core.grading.math",
    "grade_answer": "gem_core.grading.math",
    "MathGrade": "gem_core.grading.math",
    "MathGradingPool": "gem_core.grading.pool",
    "shared_math_pool": "gem_core.grading.pool",
    "GradingUnavailable": "gem_core.grading.pool",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gem_core.grading' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
