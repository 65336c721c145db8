"""Per-env summaries of evaluation results: success rate with a Wilson 95% interval, mean return, mean
turns, tool calls per episode; as a plain-text or Markdown table.

The Wilson score interval is used rather than ``p +- 1.96 * sqrt(p(1-p)/n)`` because it stays inside
[0, 1] and does not collapse to a width of zero at 0% or 100%, which small evaluations hit often.
Episodes that ended with an error count as failures (the error column says how many there were).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gem_core.eval.results import EpisodeResult
from gem_core.wrappers import EpisodeTotals

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile
ALL = "all"


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (95% for the default ``z``)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class EnvSummary:
    """What the episodes of one env (or ``"all"``) did."""

    env_id: str
    episodes: int
    successes: int
    errors: int
    mean_return: float
    mean_turns: float
    tool_calls_per_episode: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)

    @classmethod
    def of(cls, env_id: str, results: Sequence[EpisodeResult]) -> EnvSummary:
        n = len(results)
        totals = EpisodeTotals.of({"return": r.return_, "length": r.turns, "success": r.success} for r in results)
        return cls(
            env_id=env_id,
            episodes=n,
            successes=totals.successes,
            errors=sum(r.error is not None for r in results),
            mean_return=totals.mean_return,
            mean_turns=totals.mean_length,
            tool_calls_per_episode=sum(r.tool_calls for r in results) / n if n else 0.0,
        )


def summarize(results: Iterable[EpisodeResult]) -> list[EnvSummary]:
    """One summary per env, in the order the envs first appear, and an ``"all"`` row when there is
    more than one env."""
    by_env: dict[str, list[EpisodeResult]] = {}
    everything: list[EpisodeResult] = []
    for result in results:
        by_env.setdefault(result.env_id, []).append(result)
        everything.append(result)
    rows = [EnvSummary.of(env_id, group) for env_id, group in by_env.items()]
    if len(rows) > 1:
        rows.append(EnvSummary.of(ALL, everything))
    return rows


COLUMNS = ("env", "episodes", "success", "95% CI", "mean return", "mean turns", "tool calls/ep", "errors")


def _cells(row: EnvSummary) -> list[str]:
    low, high = row.interval
    return [
        row.env_id,
        str(row.episodes),
        f"{row.success_rate:.3f}",
        f"[{low:.3f}, {high:.3f}]",
        f"{row.mean_return:.3f}",
        f"{row.mean_turns:.2f}",
        f"{row.tool_calls_per_episode:.2f}",
        str(row.errors),
    ]


def format_table(rows: Sequence[EnvSummary], *, markdown: bool = False) -> str:
    """The summary as an aligned text table, or a Markdown table."""
    cells = [_cells(row) for row in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    widths = [max(len(COLUMNS[i]), *(len(c[i]) for c in cells)) for i in range(len(COLUMNS))]

    def render(values: Sequence[str]) -> str:  # the env column left-aligned, numbers right-aligned
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([render(COLUMNS)] + [render(c) for c in cells])
