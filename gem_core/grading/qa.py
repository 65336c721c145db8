"""QA grading: SQuAD's answer normalisation, exact match and token F1, and the ``<answer>`` tag.

:func:`normalize_answer` is SQuAD's (lower case, punctuation and the articles a/an/the removed,
whitespace collapsed), as GEM's and Search-R1's QA rewards use it. The reward is exact match against
any gold answer; F1 (the best over the gold answers) goes in ``info``. Answers longer than
:data:`MAX_ANSWER_CHARS` are graded wrong without being compared.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from typing import Any

from gem_core.parsing import all_tagged

MAX_ANSWER_CHARS = 2000
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def gold_list(gold: Any) -> list[str]:
    """The gold answers of a row: a string, a number or a list (numpy arrays from parquet included)."""
    if hasattr(gold, "tolist"):
        gold = gold.tolist()
    items: Iterable[Any] = gold if isinstance(gold, (list, tuple)) else [gold]
    return [str(item) for item in items if item is not None and str(item).strip()]


def exact_match(prediction: str, golds: Any) -> bool:
    """Whether ``prediction`` equals some gold answer after :func:`normalize_answer`."""
    if len(prediction) > MAX_ANSWER_CHARS:
        return False
    normalized = normalize_answer(prediction)
    return any(normalized == normalize_answer(gold) for gold in gold_list(golds))


def f1_score(prediction: str, golds: Any) -> float:
    """SQuAD's token F1 of ``prediction``, the best over the gold answers."""
    if len(prediction) > MAX_ANSWER_CHARS:
        return 0.0
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in gold_list(golds):
        truth = normalize_answer(gold).split()
        common = sum((Counter(predicted) & Counter(truth)).values())
        if common == 0:
            continue
        precision, recall = common / len(predicted), common / len(truth)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def last_answer_tag(text: Any) -> str | None:
    """The content of the last ``<answer>...</answer>`` in ``text``, or None."""
    if not isinstance(text, str) or "<answer>" not in text:
        return None
    start = text.rfind("<answer>")
    end = text.find("</answer>", start)
    if end < 0:
        found = all_tagged(text, "<answer>", "</answer>")  # linear (a (.*?) regex is quadratic here)
        return found[-1].body if found else None
    return text[start + len("<answer>") : end]
