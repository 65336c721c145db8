"""Math envs: one question from a dataset, answered in ``\\boxed{}`` and graded by math-verify.

Single turn (the GEM paper's math setting): the reset observation is the question and the instruction
to box the answer; the step grades the last ``\\boxed{}`` of the response (:func:`gem_core.grading.grade_math`,
in the process's shared grading pool, with ``grade_timeout`` seconds per answer) and ends the episode:
reward 1 for an equivalent answer, 0 otherwise. A response without ``\\boxed{}`` is a format error
(reward 0). With the Python tool (``TaskSpec(..., tools=("python",))`` or ``make-dataset --tools
python``) the model runs code between its answers; tool turns do not reach this env.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gem_core.envs.datasets import DatasetEnv, EvalSetMixin
from gem_core.params import Param
from gem_core.parsing import echo

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class MathEnv(DatasetEnv):
    """A math question per episode (see the module docstring); ``grade_timeout``: seconds per answer."""

    params: ClassVar[dict[str, Param]] = {**DatasetEnv.params, "grade_timeout": Param(float, low=0.1, high=600.0)}
    instruction = MATH_INSTRUCTION

    def __init__(
        self,
        dataset_name: str | None = None,
        split: str = "train",
        data_files: Any = None,
        question_key: str = "problem",
        answer_key: str = "answer",
        seed: int = 0,
        shuffle: bool = True,
        grade_timeout: float = 2.0,
    ):
        super().__init__(dataset_name, split, data_files, question_key, answer_key, seed, shuffle)
        self.grade_timeout = float(grade_timeout)

    def grade(self, action: Any, row: dict[str, Any]) -> tuple[float, dict[str, Any], str]:
        from gem_core.grading.math import grade_math

        result = grade_math(action, row[self.answer_key], time_limit_s=self.grade_timeout)
        info: dict[str, Any] = {"correct": result.correct, "format_error": not result.formatted, "graded_by": result.how}
        if result.error:
            info["grading_error"] = result.error
        if not result.formatted:
            observation = "Your answer was not graded: put the final answer inside \\boxed{}."
        else:
            verdict = "correct" if result.correct else "not correct"
            observation = f"Your answer {echo(result.answer)} is {verdict}."
        return (1.0 if result.correct else 0.0), info, observation

    def sample_random_action(self) -> str:
        return "\\boxed{" + str(int(self.np_random.integers(-10, 100))) + "}"


class MathEvalSet(EvalSetMixin, MathEnv):
    """A math evaluation set: the split in order, ``len()`` items (``gem-core eval`` plays each once)."""
