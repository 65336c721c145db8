"""Math grading: the table of equivalent and non-equivalent answers, the cheap rules agreeing with
math-verify, per-answer time limits in the shared pool (no SIGALRM, usable from threads)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("math_verify", reason="the math grader needs the tasks extra")

sys.path.insert(0, str(Path(__file__).parent))

from math_cases import MATH_CASES  # noqa: E402

from gem_core.grading.math import gold_answers, grade_math, quick_verdict  # noqa: E402
from gem_core.grading.pool import MathGradingPool, shared_math_pool  # noqa: E402
from gem_core.parsing import last_boxed  # noqa: E402


def test_the_table_has_at_least_40_cases():
    assert len(MATH_CASES) >= 40
    assert {expected for *_, expected, _ in MATH_CASES} == {True, False}


@pytest.mark.parametrize(("gold", "response", "expected", "why"), MATH_CASES, ids=[c[3] for c in MATH_CASES])
def test_math_table(gold, response, expected, why):
    # verdicts, not speed: a loaded machine (CI runs two sessions at once on 2 cores) can take sympy past
    # the 2 s default on the symbolic cases; the time limit has its own test below
    assert grade_math(response, gold, time_limit_s=60.0).correct is expected, why


def test_the_cheap_rules_agree_with_math_verify():
    """Every case a cheap rule decides gets the same verdict from math-verify itself."""
    pool = shared_math_pool()
    decided = 0
    for gold, response, _expected, why in MATH_CASES:
        answer = last_boxed(response)
        if not answer or len(answer) > 1000:
            continue
        golds = gold_answers(gold)
        quick = quick_verdict(golds, answer.strip())
        if quick is not None:
            decided += 1
            assert pool.grade(golds, answer.strip()).correct is quick[0], why
    assert decided >= 10


def test_the_number_rules_agree_with_math_verify_on_random_pairs():
    """Pairs of exact numbers in several forms, some equal, some close, some apart: the cheap number rule's
    verdict, where it gives one, is math-verify's."""
    import random
    from fractions import Fraction

    rng = random.Random(0)
    pool = shared_math_pool()

    def form(value: Fraction) -> str:
        choice = rng.randrange(4)
        if choice == 0 or value.denominator == 1:
            return str(value.numerator) if value.denominator == 1 else f"{float(value):.6f}"
        if choice == 1:
            return f"{value.numerator}/{value.denominator}"
        sign = "-" if value < 0 else ""
        return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"

    checked = 0
    for _ in range(60):
        a = Fraction(rng.randint(-50, 50), rng.randint(1, 12))
        b = rng.choice([a, a + Fraction(1, 10**7), a + Fraction(rng.randint(1, 9), 1000), Fraction(rng.randint(-50, 50), rng.randint(1, 12))])
        gold, answer = form(a), form(b)
        quick = quick_verdict([gold], answer)
        if quick is not None:
            checked += 1
            assert pool.grade([gold], answer).correct is quick[0], (gold, answer, quick)
    assert checked >= 30


def test_gold_answers_forms():
    assert gold_answers(3) == ["3"]
    assert gold_answers(["1", 2]) == ["1", "2"]
    assert gold_answers("so \\boxed{\\frac{1}{2}}") == ["\\frac{1}{2}"]


def test_a_pathological_answer_times_out_and_the_pool_goes_on():
    pool = shared_math_pool()
    start = time.monotonic()
    result = grade_math("\\boxed{9^{9^{9^{9^{9}}}}}", "1", time_limit_s=0.5)
    assert time.monotonic() - start < 30  # the tower would take forever; room for a loaded machine's kill and restart
    assert result.correct is False and result.how == "timeout"
    assert grade_math("\\boxed{\\frac{2}{4}}", "0.5").correct
    assert pool.timeouts >= 1


def test_no_sigalrm_and_grading_from_threads():
    """math-verify's own timeouts (SIGALRM) are never used: grading works off the main thread and
    leaves the caller's SIGALRM handler alone."""
    before = signal.getsignal(signal.SIGALRM)
    answers = [f"\\boxed{{\\frac{{{k}}}{{{2 * k}}}}}" for k in range(1, 17)]
    with ThreadPoolExecutor(8) as executor:
        verdicts = list(executor.map(lambda r: grade_math(r, "0.5").correct, answers))
    assert all(verdicts)
    assert signal.getsignal(signal.SIGALRM) is before
    assert threading.current_thread() is threading.main_thread()


def test_the_pool_is_bounded_and_shared():
    pool = MathGradingPool(size=2)
    try:
        with ThreadPoolExecutor(6) as executor:
            verdicts = list(executor.map(lambda k: pool.grade([f"\\sqrt{{{k * k}}}"], str(k)).correct, range(2, 14)))
        assert all(verdicts)
        assert len(pool._all) <= 2
    finally:
        pool.close()
    assert shared_math_pool() is shared_math_pool()
