"""benchmarks/micro_batch.py on the tiny model: every budget timed and its table row printed, the update of every
budget checked against the first (a check that fails when the tolerance is below the difference)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.scripts import script_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with script_module(ROOT / "benchmarks" / "micro_batch.py") as module:
        yield module


def test_every_budget_is_timed_checked_and_tabled(bench, capsys):
    assert bench.main(["--model", "tiny", "--episodes", "4", "--repeats", "1", "--budgets", "64", "256", "--precision", "float32"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 64 |") or line.startswith("| 256 |")]
    assert len(rows) == 2 and rows[0].endswith("| 1.00x |")
    assert "repeat 0: 64 tokens" in out and "repeat 0: 256 tokens" in out


def test_a_budget_whose_update_differs_stops_the_benchmark(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "TOLERANCE", -1.0)  # every difference, even 0, is over it
    assert bench.main(["--model", "tiny", "--episodes", "4", "--repeats", "1", "--budgets", "64", "256", "--precision", "float32"]) == 1
    assert "the budgets' gradients differ" in capsys.readouterr().err


def test_bad_arguments_are_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--budgets", "0"])
    assert exit_info.value.code == 2 and "every budget >= 1" in capsys.readouterr().err
