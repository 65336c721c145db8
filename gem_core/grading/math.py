"""Math grading: the last ``\\boxed{}`` of a response against the gold answer(s), by math-verify.

:func:`grade_math` takes the content of the response's last ``\\boxed{...}`` (braces balanced,
:func:`gem_core.parsing.last_boxed`) and asks math-verify whether it equals a gold answer: fractions,
LaTeX forms (``\\dfrac``, ``\\left(``), decimals, sets, intervals, tuples and symbolic equality.
math-verify runs in this process's shared worker pool (:mod:`gem_core.grading.pool`), each answer with
its own time limit, so a pathological answer cannot stall an env.

Cheap rules decide before the pool is asked, and agree with math-verify (the table in
tests/grading/test_math_grading.py and ``benchmarks/grading.py`` check it): answers that are the same
text once spaces, ``$`` and spacing/sizing commands (``\\left``, ``\\!``, ``\\dfrac`` for ``\\frac``)
are removed are equal; two integers of at most 15 digits are equal exactly when their values are; two
exact numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``) or two ``\\{...\\}`` sets of them are equal
when their values are, and different when they are further apart than math-verify's rounding could
bridge (relative 1e-4); anything closer goes to math-verify.
Answers longer than :data:`MAX_ANSWER_CHARS` are wrong without being parsed. Verdicts are cached
per process (the same answer to the same question is graded once).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from fractions import Fraction
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gem_core.grading.pool import DEFAULT_TIME_LIMIT_S, MathGradingPool, shared_math_pool
from gem_core.parsing import last_boxed

#: Boxed answers longer than this are graded wrong without parsing (no real answer is this long).
MAX_ANSWER_CHARS = 1000
_CACHE_SIZE = 65536


@dataclass(frozen=True)
class MathGrade:
    """One graded response. ``answer``: the last boxed content (None: no ``\\boxed{}``, a format error);
    ``how``: ``"text"``/``"integer"`` (decided by a cheap rule), ``"math-verify"``, ``"cache"``,
    ``"too long"``, ``"timeout"``, ``"error"`` or ``"no answer"``."""

    correct: bool
    answer: str | None
    how: str
    error: str | None = None

    @property
    def formatted(self) -> bool:
        return self.answer is not None


def gold_answers(gold: Any) -> list[str]:
    """The gold answer(s) of a dataset row as text: a string (its own last ``\\boxed{}`` when it has
    one), a number, or a list of either."""
    items = list(gold) if isinstance(gold, (list, tuple)) else [gold]
    out = []
    for item in items:
        if hasattr(item, "item"):  # numpy scalars from parquet rows
            item = item.item()
        text = str(item).strip()
        if "\\boxed" in text:
            text = last_boxed(text) or text
        if text:
            out.append(text)
    return out


_COSMETIC = re.compile(r"\\left|\\right|\\displaystyle|\\[!,;: ]|\s|\$")


def _cosmetic(text: str) -> str:
    text = _COSMETIC.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return text.rstrip(".")


_INTEGER = re.compile(r"-?\d{1,15}")
_DECIMAL = re.compile(r"-?\d{1,15}(?:\.\d{1,15})?")
_FRAC = re.compile(r"(-?)\\frac\{(-?\d{1,15})\}\{(\d{1,15})\}")
_SLASH = re.compile(r"(-?\d{1,15})/(\d{1,15})")
_SET = re.compile(r"\\\{(.*)\\\}")
#: Two numbers further apart than this (relative) are different whatever math-verify's rounding does.
_APART = 1e-4


def _rational(text: str) -> Fraction | None:
    """``text`` (already :func:`_cosmetic`) as an exact number: ``-12``, ``0.25``, ``3/4``, ``\\frac{3}{4}``,
    ``-\\frac{3}{4}``, any of them in one pair of parentheses; else None."""
    if len(text) > 2 and text[0] == "(" and text[-1] == ")" and "," not in text:
        text = text[1:-1]
    if _DECIMAL.fullmatch(text):
        return Fraction(text)
    m = _FRAC.fullmatch(text) or _SLASH.fullmatch(text)
    if m is None:
        return None
    groups = m.groups()
    sign, num, den = ("", *groups) if len(groups) == 2 else groups
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return -value if sign else value


def _apart(a: Fraction, b: Fraction) -> bool:
    return abs(a - b) > _APART * max(1, abs(a), abs(b))


def _rational_set(text: str) -> list[Fraction] | None:
    m = _SET.fullmatch(text)
    if m is None:
        return None
    items = [_rational(item) for item in m[1].split(",")]
    return None if any(item is None for item in items) else items  # type: ignore[return-value]


def _compare_numbers(gold: str, answer: str) -> bool | None:
    """True (equal), False (apart), or None (undecided) for two numbers or two sets of numbers."""
    a, b = _rational(gold), _rational(answer)
    if a is not None and b is not None:
        return True if a == b else (False if _apart(a, b) else None)
    sa, sb = _rational_set(gold), _rational_set(answer)
    if sa is None or sb is None:
        return None
    if set(sa) == set(sb):
        return True
    if all(any(not _apart(x, y) for y in sb) for x in sa) and all(any(not _apart(x, y) for y in sa) for x in sb):
        return None  # close but not equal: math-verify's rounding decides
    return False


def quick_verdict(golds: Sequence[str], answer: str) -> tuple[bool, str] | None:
    """A verdict without math-verify when a cheap rule settles it (see the module docstring), else None."""
    plain = _cosmetic(answer)
    cosmetic_golds = [_cosmetic(gold) for gold in golds]
    if plain in cosmetic_golds:
        return True, "text"
    if _INTEGER.fullmatch(plain) and all(_INTEGER.fullmatch(gold) for gold in cosmetic_golds):
        return any(int(plain) == int(gold) for gold in cosmetic_golds), "integer"
    verdicts = [_compare_numbers(gold, plain) for gold in cosmetic_golds]
    if True in verdicts:
        return True, "number"
    if verdicts and all(v is False for v in verdicts):
        return False, "number"
    return None


class _Cache:
    """A small thread-safe LRU of verdicts keyed by (golds, answer)."""

    def __init__(self, size: int):
        self.size = size
        self.data: OrderedDict[tuple[tuple[str, ...], str], bool] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[tuple[str, ...], str]) -> bool | None:
        with self.lock:
            value = self.data.get(key)
            if value is not None:
                self.data.move_to_end(key)
            return value

    def put(self, key: tuple[tuple[str, ...], str], value: bool) -> None:
        with self.lock:
            self.data[key] = value
            if len(self.data) > self.size:
                self.data.popitem(last=False)


_cache = _Cache(_CACHE_SIZE)


def grade_answer(answer: str, gold: Any, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, pool: MathGradingPool | None = None) -> MathGrade:
    """Grade an extracted ``answer`` (the boxed content) against ``gold`` (see :func:`gold_answers`)."""
    golds = gold_answers(gold)
    answer = answer.strip()
    if not golds or not answer:
        return MathGrade(False, answer, "text")
    if len(answer) > MAX_ANSWER_CHARS:
        return MathGrade(False, answer, "too long")
    quick = quick_verdict(golds, answer)
    if quick is not None:
        return MathGrade(quick[0], answer, quick[1])
    key = (tuple(golds), answer)
    cached = _cache.get(key)
    if cached is not None:
        return MathGrade(cached, answer, "cache")
    verdict = (pool or shared_math_pool()).grade(golds, answer, time_limit_s)
    if verdict.timed_out:
        return MathGrade(False, answer, "timeout", f"grading took longer than {time_limit_s:g} s")
    if verdict.error is not None:
        return MathGrade(False, answer, "error", verdict.error)
    _cache.put(key, verdict.correct)
    return MathGrade(verdict.correct, answer, "math-verify")


def grade_math(response: Any, gold: Any, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, pool: MathGradingPool | None = None) -> MathGrade:
    """Grade a model response: its last ``\\boxed{}`` against ``gold``. No box: wrong, ``answer=None``."""
    answer = last_boxed(response) if isinstance(response, str) else None
    if answer is None:
        return MathGrade(False, None, "no answer")
    return grade_answer(answer, gold, time_limit_s=time_limit_s, pool=pool)
