"""Code envs: a programming problem from a dataset, the solution in a fenced code block, graded by
running it against the problem's tests in the shared bubblewrap sandbox (:mod:`gem_core.grading.code`).

Single turn. Reward 1 when every case passes, else 0 (``partial_credit=True``: the fraction passed);
``info`` has ``passed``/``total`` and the first failing case (its verdict -- wrong answer, runtime
error, time limit, output limit -- input, expected and actual output, each echoed bounded). A response
without a fenced block is a format error (reward 0).
"""

from __future__ import annotations

from typing import Any, ClassVar

from gem_core.envs.datasets import DatasetEnv, EvalSetMixin
from gem_core.errors import INFRA_ERROR
from gem_core.params import Param

CODE_INSTRUCTION = (
    "Write a complete Python 3 solution. It reads from standard input and writes to standard output "
    "(or, when the problem names a function, defines that function). Put the final program in one "
    "```python fenced code block at the end of your answer."
)


class CodeEnv(DatasetEnv):
    """A coding problem per episode (see the module docstring). ``test_key``: the row's tests field;
    ``max_tests``: cases run per answer; ``time_limit``: seconds per case."""

    params: ClassVar[dict[str, Param]] = {
        **{k: v for k, v in DatasetEnv.params.items() if k != "answer_key"},
        "test_key": Param(str),
        "max_tests": Param(int, low=1, high=1000),
        "time_limit": Param(float, low=0.1, high=60.0),
        "partial_credit": Param(bool),
    }
    instruction = CODE_INSTRUCTION
    answer_format = "code"

    def __init__(
        self,
        dataset_name: str | None = None,
        split: str = "train",
        data_files: Any = None,
        question_key: str = "problem",
        test_key: str = "tests",
        seed: int = 0,
        shuffle: bool = True,
        max_tests: int = 12,
        time_limit: float = 2.0,
        partial_credit: bool = False,
    ):
        super().__init__(dataset_name, split, data_files, question_key, test_key, seed, shuffle)
        self.max_tests, self.time_limit, self.partial_credit = int(max_tests), float(time_limit), bool(partial_credit)
        self._sandbox: Any = None

    def _get_sandbox(self) -> Any:
        if getattr(self, "_sandbox", None) is None:
            from gem_core.tools.sandbox import PythonSandbox

            self._sandbox = PythonSandbox()  # a handle on the process's shared pool
        return self._sandbox

    def grade(self, action: Any, row: dict[str, Any]) -> tuple[float, dict[str, Any], str]:
        from gem_core.grading.code import grade_code, last_code_block

        if last_code_block(action) is None or not str(last_code_block(action)).strip():
            return 0.0, {"correct": False, "format_error": True}, "Your answer was not graded: put the program in a ```python fenced code block."
        result = grade_code(action, row[self.answer_key], sandbox=self._get_sandbox(), max_tests=self.max_tests, time_limit_s=self.time_limit)
        info: dict[str, Any] = {
            "correct": result.all_passed,
            "format_error": False,
            "passed": result.passed,
            "total": result.total,
            "pass_rate": result.pass_rate,
        }
        if result.failure is not None:
            info["failure"] = result.failure
        if result.error:
            info["sandbox_error"] = result.error[:300]
        if result.sandbox_failed:
            info[INFRA_ERROR] = f"code sandbox: {result.error}"[:300]
        if result.all_passed:
            observation = f"All {result.total} tests passed."
        elif result.failure is not None:
            f = result.failure
            observation = f"{result.passed} of {result.total} tests passed. Test {f['case']}: {f['verdict']} (input {f['input']}, expected {f['expected']}, got {f['got']})."
        else:
            observation = f"The program was not run: {result.error or 'no tests'}."
        reward = result.pass_rate if self.partial_credit else float(result.all_passed)
        return reward, info, observation

    def sample_random_action(self) -> str:
        bodies = ["print(input())", "print(42)", "import sys\nprint(sum(map(int, sys.stdin.read().split())))"]
        return "```python\n" + bodies[int(self.np_random.integers(len(bodies)))] + "\n```"

    def close(self) -> None:
        if getattr(self, "_sandbox", None) is not None:
            self._sandbox.close()
            self._sandbox = None

    _LOCAL = frozenset({"_sandbox"})
    _answer_param = "test_key"


class CodeEvalSet(EvalSetMixin, CodeEnv):
    """A code evaluation set: the split in order, ``len()`` items."""
