"""The few statistics the benchmarks report, written out with the standard library (no scipy at run time).

Every result here is a distribution over seeds, so each benchmark needs the same handful of tools: the exact
(Clopper-Pearson) interval of a rate (how often a run collapses or stays at a ceiling), Student's t interval of a
mean over seeds, the exact sign test on paired differences (a paper's finding, seed by seed), and the smallest margin
at which two one-sided tests (TOST) show two sets of runs equivalent (how close another trainer is to the reference).

Student's t is computed for whole degrees of freedom from its closed form (Abramowitz and Stegun 26.7.3-4);
Welch's fractional degrees of freedom are rounded down, which widens an interval a little and never narrows it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

__all__ = [
    "binomial_interval",
    "equivalence_margin",
    "mean_interval",
    "sign_test",
    "t_cdf",
    "t_quantile",
    "welch_interval",
]


def _check_level(name: str, value: float, high: float = 1.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < high:
        raise ValueError(f"{name} must be a number in (0, {high:g}), got {value!r}")


def _bisect(f: Callable[[float], float], target: float, low: float, high: float, increasing: bool) -> float:
    """The x in [low, high] where the monotone ``f`` crosses ``target`` (100 halvings: below a float's precision)."""
    for _ in range(100):
        mid = (low + high) / 2
        if (f(mid) < target) == increasing:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def binomial_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial rate, by bisection on the binomial tails."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"expected 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    _check_level("level", level)

    def tail_at_least(p: float) -> float:  # P(X >= successes)
        return sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(successes, trials + 1))

    def tail_at_most(p: float) -> float:  # P(X <= successes)
        return sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(0, successes + 1))

    alpha = (1 - level) / 2
    lower = 0.0 if successes == 0 else _bisect(tail_at_least, alpha, 0.0, 1.0, increasing=True)
    upper = 1.0 if successes == trials else _bisect(tail_at_most, alpha, 0.0, 1.0, increasing=False)
    return lower, upper


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` (a whole number >= 1) degrees of freedom, in closed form: with
    theta = atan(t / sqrt(df)), P(|T| < |t|) is a finite sum of powers of cos(theta) (A&S 26.7.3-4)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a whole number >= 1, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + (2*4)/(3*5) cos^4 + ... up to cos^(df-3)))
        term, total = 1.0, 0.0
        if df > 1:
            total = 1.0
            for k in range(1, (df - 3) // 2 + 1):
                term *= cos2 * (2 * k) / (2 * k + 1)
                total += term
        inside = 2 / math.pi * (theta + sin * math.cos(theta) * total) if df > 1 else 2 * theta / math.pi
    else:  # even: sin (1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ... up to cos^(df-2))
        term, total = 1.0, 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        inside = sin * total
    return 0.5 + math.copysign(inside / 2, t)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    _check_level("p", p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    high = 1.0
    while t_cdf(high, df) < p:
        high *= 2
    return _bisect(lambda x: t_cdf(x, df), p, 0.0, high, increasing=True)


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The mean's confidence interval over ``values`` (Student's t, n - 1 degrees of freedom); None below two."""
    _check_level("level", level)
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(1 - (1 - level) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """mean(a) - mean(b) and its confidence interval, Welch's (unequal variances; the degrees of freedom
    Welch-Satterthwaite's, rounded down): (difference, low, high). None unless each side has two values."""
    _check_level("level", level)
    if len(a) < 2 or len(b) < 2:
        return None
    difference = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:  # every run of both ended alike: no spread to test against
        return difference, difference, difference
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(1 - (1 - level) / 2, max(1, math.floor(df))) * math.sqrt(va + vb)
    return difference, difference - half, difference + half


def equivalence_margin(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> float | None:
    """The smallest margin m at which two one-sided Welch tests at ``alpha`` show |mean(a) - mean(b)| < m: the
    farther end of the difference's 1 - 2 alpha interval from 0 (TOST rejects both "difference <= -m" and
    "difference >= m" exactly when that interval lies inside (-m, m)). A trainer whose weights never move is far from
    a reference that learns, so its margin is wide: the margin is the result, not a gate. None unless each side has
    two values."""
    _check_level("alpha", alpha, high=0.5)
    bounds = welch_interval(a, b, level=1 - 2 * alpha)
    return None if bounds is None else max(abs(bounds[1]), abs(bounds[2]))


def sign_test(differences: Sequence[float]) -> tuple[int, int, float]:
    """The two-sided exact sign test of "the median paired difference is 0": (differences above 0, differences not
    0, p-value). A tie (a difference of exactly 0) is dropped; no difference left gives p = 1."""
    nonzero = [d for d in differences if d != 0]
    n, above = len(nonzero), sum(d > 0 for d in nonzero)
    if not n:
        return 0, 0, 1.0
    tail = sum(math.comb(n, i) for i in range(min(above, n - above) + 1)) / 2**n
    return above, n, min(1.0, 2 * tail)
