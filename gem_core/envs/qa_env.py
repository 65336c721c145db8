"""QA envs: a question from a dataset, the answer in ``<answer>...</answer>`` (or ``\\boxed{}`` for the
logic sets), graded by SQuAD-normalised exact match (reward 1/0), F1 in ``info``.

Single turn. With the search tool (``TaskSpec(..., tools=("search",))``, the backend from
``GEM_SEARCH_URL`` or ``GEM_SEARCH_CORPUS``) the model searches between its answers; tool turns do
not reach this env.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gem_core.envs.datasets import DatasetEnv, EvalSetMixin
from gem_core.params import Param
from gem_core.parsing import echo, last_boxed

QA_INSTRUCTION = (
    "Reason through the question step by step inside <think> ... </think>, then give your final answer as a short phrase inside <answer> ... </answer>."
)
BOXED_INSTRUCTION = "Reason step by step, then give your final answer inside \\boxed{}."


class QaEnv(DatasetEnv):
    """A question per episode; ``extract_boxed=True`` reads the answer from ``\\boxed{}`` instead of the tag."""

    params: ClassVar[dict[str, Param]] = {**DatasetEnv.params, "extract_boxed": Param(bool)}

    def __init__(
        self,
        dataset_name: str | None = None,
        split: str = "train",
        data_files: Any = None,
        question_key: str = "question",
        answer_key: str = "answer",
        seed: int = 0,
        shuffle: bool = True,
        extract_boxed: bool = False,
    ):
        super().__init__(dataset_name, split, data_files, question_key, answer_key, seed, shuffle)
        self.extract_boxed = bool(extract_boxed)

    @property
    def answer_format(self) -> str:
        """``"boxed"`` or ``"answer_tag"``: where the env reads the answer."""
        return "boxed" if self.extract_boxed else "answer_tag"

    @property
    def instruction(self) -> str:  # type: ignore[override]
        return BOXED_INSTRUCTION if self.extract_boxed else QA_INSTRUCTION

    def extract(self, action: Any) -> str | None:
        from gem_core.grading.qa import last_answer_tag

        if not isinstance(action, str):
            return None
        return last_boxed(action) if self.extract_boxed else last_answer_tag(action)

    def grade(self, action: Any, row: dict[str, Any]) -> tuple[float, dict[str, Any], str]:
        from gem_core.grading.qa import exact_match, f1_score

        answer = self.extract(action)
        if answer is None:
            where = "\\boxed{}" if self.extract_boxed else "<answer> ... </answer>"
            return 0.0, {"correct": False, "f1": 0.0, "format_error": True}, f"Your answer was not graded: put it inside {where}."
        gold = row[self.answer_key]
        correct = exact_match(answer, gold)
        info = {"correct": correct, "f1": f1_score(answer, gold), "format_error": False}
        return (1.0 if correct else 0.0), info, f"Your answer {echo(answer.strip())} is {'correct' if correct else 'not correct'}."

    def sample_random_action(self) -> str:
        words = ["yes", "no", "Paris", "1990", "blue", "the river"]
        word = words[int(self.np_random.integers(len(words)))]
        return "\\boxed{" + word + "}" if self.extract_boxed else f"<answer>{word}</answer>"


class QaEvalSet(EvalSetMixin, QaEnv):
    """A QA evaluation set: the split in order, ``len()`` items."""
