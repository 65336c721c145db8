"""``gem-core eval report``: several results files side by side, as Markdown and a bar chart.

Each file is a *run*, named by the model its lines record (or by the file name when that is not
unique). The report has a comparison table (success rate and 95% Wilson interval per env and run),
then each run's full summary table. The chart (matplotlib, optional) has one group of bars per env,
one bar per run, with the intervals as error bars.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from gem_core.eval.results import EpisodeResult, read_results
from gem_core.eval.summary import ALL, EnvSummary, format_table, summarize


class ReportError(ValueError):
    """A report that cannot be made (an empty file, matplotlib missing for --plot)."""


@dataclass(frozen=True)
class Run:
    """One results file: its name in the report, its path, its results and their summaries."""

    name: str
    path: str
    results: list[EpisodeResult]
    summaries: list[EnvSummary]

    def summary(self, env_id: str) -> EnvSummary | None:
        return next((s for s in self.summaries if s.env_id == env_id), None)


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Read the files; each run is named by its model, or by its file name when two share a model."""
    loaded = []
    for path in paths:
        results, _ = read_results(path)
        if not results:
            raise ReportError(f"{path} holds no results")
        models = sorted({r.model for r in results})
        loaded.append((models[0] if len(models) == 1 else os.path.basename(path), path, results))
    names = [name for name, _, _ in loaded]
    runs = []
    for name, path, results in loaded:
        if names.count(name) > 1:
            name = f"{name} ({os.path.basename(path)})"
        runs.append(Run(name, path, results, summarize(results)))
    return runs


def env_order(runs: Sequence[Run]) -> list[str]:
    """Every env of every run, in the order first seen (without the ``all`` rows)."""
    seen: dict[str, None] = {}
    for run in runs:
        seen.update((s.env_id, None) for s in run.summaries if s.env_id != ALL)
    return list(seen)


def markdown(runs: Sequence[Run], chart: str | None = None) -> str:
    """The report; ``chart``: an image path to show under the comparison table."""
    lines = ["# gem-core eval report", ""]
    lines += ["| run | file | episodes | errors |", "|---|---|---:|---:|"]
    for run in runs:
        lines.append(f"| {run.name} | `{run.path}` | {len(run.results)} | {sum(r.error is not None for r in run.results)} |")
    lines += ["", "## Success rate (95% Wilson interval)", ""]
    lines.append("| env | " + " | ".join(run.name for run in runs) + " |")
    lines.append("|---|" + "---:|" * len(runs))
    for env_id in env_order(runs):
        cells = []
        for run in runs:
            row = run.summary(env_id)
            if row is None:
                cells.append("–")
            else:
                low, high = row.interval
                cells.append(f"{row.success_rate:.3f} [{low:.3f}, {high:.3f}] (n={row.episodes})")
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    if chart is not None:
        lines += ["", f"![success rate by env and run]({chart})"]
    for run in runs:
        lines += ["", f"## {run.name}", "", format_table(run.summaries, markdown=True)]
    return "\n".join(lines) + "\n"


def require_matplotlib() -> None:
    """Fail early, in one line, when the chart cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install matplotlib (or pip install -e '.[train]')") from None


def plot(runs: Sequence[Run], path: str) -> None:
    """A grouped bar chart of the success rates with their intervals, saved as ``path`` (PNG)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = env_order(runs)
    width = 0.8 / len(runs)
    figure, axes = plt.subplots(figsize=(max(6.0, 2.0 + 0.6 * len(envs) * len(runs)), 4.5))
    try:
        for k, run in enumerate(runs):
            xs, rates, below, above = [], [], [], []
            for i, env_id in enumerate(envs):
                row = run.summary(env_id)
                if row is None:
                    continue
                low, high = row.interval
                xs.append(i - 0.4 + width * (k + 0.5))
                rates.append(row.success_rate)
                below.append(max(0.0, row.success_rate - low))
                above.append(max(0.0, high - row.success_rate))
            axes.bar(xs, rates, width, yerr=[below, above], capsize=3, label=run.name)
        axes.set_xticks(range(len(envs)))
        axes.set_xticklabels(envs, rotation=20, ha="right")
        axes.set_ylim(0, 1.2)  # room for the legend above the bars
        axes.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        axes.set_ylabel("success rate (95% Wilson interval)")
        axes.legend(loc="upper center", ncol=min(len(runs), 4), frameon=False)
        figure.tight_layout()
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        figure.savefig(path, format="png", dpi=120)
    finally:
        plt.close(figure)
