"""benchmarks/update_cost.py's table: the rest-of-the-update column averages only the updates with a learning
signal (the reference makes no backward on a batch whose every advantage is 0), counted in the last column;
the rollout column keeps every update."""

from __future__ import annotations

from pathlib import Path

from helpers.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]


def _update_cost():
    with script_module(ROOT / "benchmarks" / "update_cost.py") as module:
        return module


def test_an_update_without_signal_is_counted_apart_not_averaged():
    update_cost = _update_cost()
    updates = [
        {"rollout": 5.0, "update": 0.0, "no_signal": True, "load": 1.0},
        {"rollout": 8.0, "update": 10.0, "no_signal": False, "load": 2.0},
        {"rollout": 11.0, "update": 14.0, "no_signal": False, "load": 3.0},
    ]
    rows = [{"trainer": "reference", "gradient_checkpointing": "off", "peak_rss_gb": 3.96, "updates": updates}]
    line = update_cost.table(rows).splitlines()[-1].split(" | ")
    assert line[2] == "8.00 (5.00-11.00)"  # the rollouts: every update
    assert line[3] == "12.00 (10.00-14.00)"  # the rest: the two updates with signal
    assert line[4] == "3.96" and line[-1] == "1 of 3 |"
    silent = [{**u, "no_signal": True, "update": 0.0} for u in updates]
    assert update_cost.table([{**rows[0], "updates": silent}]).splitlines()[-1].split(" | ")[3] == "-"
