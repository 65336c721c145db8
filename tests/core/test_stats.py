"""gem_core.utils.stats: the exact rate interval, Student's t, Welch's interval, the TOST margin and the sign test,
against published table values and against what each must say of a broken trainer."""

from __future__ import annotations

import math

import pytest

from gem_core.utils import stats


def test_the_exact_interval_of_a_rate():
    # Clopper-Pearson: 0 of 5 -> [0, 1 - 0.025 ** (1 / 5)]; 5 of 5 -> [0.025 ** (1 / 5), 1]; 2 of 10 -> [0.0252, 0.5561]
    assert stats.binomial_interval(0, 5) == (0.0, pytest.approx(1 - 0.025 ** (1 / 5), abs=1e-9))
    assert stats.binomial_interval(5, 5) == (pytest.approx(0.025 ** (1 / 5), abs=1e-9), 1.0)
    low, high = stats.binomial_interval(2, 10)
    assert low == pytest.approx(0.0252, abs=1e-4) and high == pytest.approx(0.5561, abs=1e-4)
    with pytest.raises(ValueError):
        stats.binomial_interval(3, 2)
    with pytest.raises(ValueError):
        stats.binomial_interval(1, 2, level=95)  # a percentage, not a level


def test_a_level_alpha_or_p_outside_its_range_is_one_clear_error():
    for call in (
        lambda: stats.mean_interval([0.1, 0.2], level=1.0),
        lambda: stats.welch_interval([0.1, 0.2], [0.3, 0.4], level=0.0),
        lambda: stats.equivalence_margin([0.1, 0.2], [0.3, 0.4], alpha=0.5),  # a 0-level interval: not a test
        lambda: stats.t_quantile(1.0, 3),
    ):
        with pytest.raises(ValueError, match="must be a number in"):
            call()


@pytest.mark.parametrize(
    "p, df, table",  # Student's t quantiles as printed in any table (three decimals)
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 5, 2.571), (0.975, 10, 2.228), (0.975, 30, 2.042),
     (0.95, 4, 2.132), (0.95, 8, 1.860), (0.995, 3, 5.841), (0.975, 100, 1.984)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(p, df, table):
    assert round(stats.t_quantile(p, df), 3) == table
    assert stats.t_quantile(1 - p, df) == pytest.approx(-stats.t_quantile(p, df))
    assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


def test_t_cdf_closed_forms_and_bad_degrees_of_freedom():
    assert stats.t_cdf(0.0, 7) == 0.5
    assert stats.t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert stats.t_cdf(1.0, 2) == pytest.approx(0.5 + 0.5 / math.sqrt(3))  # 1/2 + t / (2 sqrt(t^2 + 2))
    for df in (0, 2.5, True):
        with pytest.raises(ValueError):
            stats.t_cdf(1.0, df)


def test_the_mean_interval_over_seeds():
    low, high = stats.mean_interval([0.4, 0.5, 0.6])
    half = 4.303 * 0.1 / math.sqrt(3)
    assert low == pytest.approx(0.5 - half, abs=1e-4) and high == pytest.approx(0.5 + half, abs=1e-4)
    assert stats.mean_interval([0.4]) is None


def test_welch_interval_worked_example():
    # a = 1, 2, 3, 4 (var 5/3), b = 2, 4, 6 (var 4): se^2 = 5/12 + 4/3 = 1.75; df = 1.75^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.24 -> 3
    difference, low, high = stats.welch_interval([1, 2, 3, 4], [2, 4, 6])
    half = 3.182 * math.sqrt(1.75)
    assert difference == pytest.approx(-1.5) and low == pytest.approx(-1.5 - half, abs=1e-3) and high == pytest.approx(-1.5 + half, abs=1e-3)
    assert stats.welch_interval([1.0], [2.0, 3.0]) is None
    assert stats.welch_interval([0.5, 0.5], [0.3, 0.3]) == (pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2))


def test_the_equivalence_margin_is_wide_for_a_trainer_that_never_moved():
    """The check the old "inside the reference's range" criterion could not make: a trainer whose weights never
    moved ends where it started (0.315) on every seed; against a reference that learns, its margin is larger than
    the gap between them, while a trainer drawn like the reference gets a margin of the spread's size."""
    reference = [0.70, 0.80, 0.75, 0.90, 0.65]
    frozen = [0.315] * 5
    alike = [0.72, 0.78, 0.70, 0.85, 0.68]
    gap = sum(reference) / 5 - 0.315
    assert stats.equivalence_margin(frozen, reference) > gap > 0.4
    assert stats.equivalence_margin(alike, reference) < 0.15
    # TOST at 5% is the 90% interval: its farther end from 0
    difference, low, high = stats.welch_interval(alike, reference, level=0.90)
    assert stats.equivalence_margin(alike, reference) == pytest.approx(max(abs(low), abs(high)))
    assert stats.equivalence_margin([0.5], reference) is None


def test_the_sign_test():
    assert stats.sign_test([0.1] * 6) == (6, 6, pytest.approx(2 / 64))
    assert stats.sign_test([0.1, 0.0, -0.2]) == (1, 2, 1.0)
    assert stats.sign_test([]) == (0, 0, 1.0)
