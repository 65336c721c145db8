"""benchmarks/default_run_seeds.py: the exact binomial interval, and the report of a sweep read back from run
directories (a finished run, one that stopped part way, one at the ceiling)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import default_run_seeds as sweep  # noqa: E402

CEILING = "hint-blind ceiling (random, no repeats)"


def _run(directory: Path, final: dict | None, seconds: float = 600.0) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"steps": 2}))
    start = {"step": 0, "phase": "warm_start", "eval_success_rate": 0.35, "eval_greedy_success_rate": 0.3, "baselines": {CEILING: {"success_rate": 0.4}}}
    lines = [start, {"step": 1, "phase": "rl", "peak_rss_gb": 3.2}]
    if final is not None:
        lines.append({"step": 2, "phase": "rl", "peak_rss_gb": 3.5, **final})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (directory / "sweep.json").write_text(json.dumps({"seconds": seconds}))


def test_a_sweep_is_read_back_as_a_distribution(tmp_path, capsys):
    def final(sampled, greedy, lower=1.0, higher=0.9):
        return {
            "eval_success_rate": sampled,
            "eval_greedy_success_rate": greedy,
            "eval_hint_right_after_lower_rate": lower,
            "eval_greedy_hint_right_after_lower_rate": lower,
            "eval_hint_right_after_higher_rate": higher,
            "eval_greedy_hint_right_after_higher_rate": higher,
        }

    _run(tmp_path / "x-seed0", final(0.70, 0.72))
    _run(tmp_path / "x-seed1", final(0.39, 0.40, higher=0.0))  # "always go down": at the ceiling
    _run(tmp_path / "x-seed2", None)  # stopped part way, not continued (--report-only)
    assert sweep.main(["--seeds", "0", "1", "2", "--name", "x", "--out", str(tmp_path), "--report-only"]) == 0
    text = (tmp_path / "x.md").read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 0.700 | 0.720 |" in rows["0"] and rows["0"].rstrip().endswith("| no |")
    assert rows["1"].rstrip().endswith("| yes |") and "10.0" in rows["1"]
    assert "failed or not run" in rows["2"]
    assert "| 0.545 [0.390, 0.700] |" in rows["median [range]"]
    assert "2 of 3 runs finished (1 failed or not run); 1 of 2 ended at or below the hint-blind ceiling (0.400" in text
    low, high = sweep.binomial_interval(1, 2)
    assert f"[{low:.3f}, {high:.3f}]" in text


def test_a_run_exactly_at_the_ceiling_counts_as_at_it(tmp_path):
    """The ceiling is an expectation summed in floats (0.3999999999999359 for GuessTheNumber's 0.4): a run that ends
    at 0.400 greedy is at it (before, it read as above: c8's seed 100 at 0.400 greedy was reported "no")."""
    from gem_core.envs.report import at_or_below

    assert at_or_below(0.4, 0.3999999999999359) and not at_or_below(0.405, 0.3999999999999359)
    directory = tmp_path / "y-seed0"
    _run(directory, {"eval_success_rate": 0.58, "eval_greedy_success_rate": 0.4})
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    lines[0]["baselines"] = {CEILING: {"success_rate": 0.3999999999999359}}
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sweep.run_record(str(directory))["at_ceiling"] is True


def test_another_env_is_reported_without_the_ceiling_and_with_its_own_evaluation_size(tmp_path):
    """FifteenPuzzle has no hint-blind ceiling and no hints: the report must not count it "not at the ceiling" as if
    it had been measured, and must give the run's own evaluation size and mean returns."""
    directory = tmp_path / "z-seed0"
    _run(directory, {"eval_success_rate": 0.06, "eval_greedy_success_rate": 0.1, "eval_mean_return": 0.25, "eval_greedy_mean_return": 0.3})
    (directory / "config.json").write_text(json.dumps({"updates": 2, "eval_episodes": 50}))
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    lines[0].update(baselines={}, eval_mean_return=0.17, eval_greedy_mean_return=0.04)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sweep.main(["--seeds", "0", "--name", "z", "--out", str(tmp_path), "--report-only"]) == 0
    text = (tmp_path / "z.md").read_text()
    assert "(held-out set, 50 episodes an evaluation)" in text and "200" not in text
    assert "the env has no hint-blind ceiling" in text and "ended at or below" not in text
    assert "Mean return after the warm start 0.170 sampled / 0.040 greedy, after RL 0.250 / 0.300." in text


def test_the_band_is_the_median_and_range_over_seeds_missing_values_left_out():
    median, low, high = sweep.band([[0.2, None, 0.5], [0.4, 0.0, None], [0.9, 1.0, None]])
    assert median[:2] == [0.4, 0.5] and low[:2] == [0.2, 0.0] and high[:2] == [0.9, 1.0]
    assert (median[2], low[2], high[2]) == (0.5, 0.5, 0.5)


def test_the_figure_draws_the_finished_seeds(tmp_path):
    pytest.importorskip("matplotlib")
    final = {"eval_success_rate": 0.6, "eval_greedy_success_rate": 0.7}
    _run(tmp_path / "x-seed0", final)
    _run(tmp_path / "x-seed1", None)  # unfinished: not drawn, not an error
    png = tmp_path / "band.png"
    assert sweep.main(["--seeds", "0", "1", "--name", "x", "--out", str(tmp_path), "--report-only", "--figure", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = sweep.update_curves(str(tmp_path / "x-seed0"))
    assert curves["eval_step"] == [0, 2] and curves["eval_sampled"] == [0.35, 0.6] and curves["step"] == []


def _with_weights(directory: Path, content: bytes) -> None:
    (directory / "model").mkdir()
    (directory / "model" / "model.safetensors").write_bytes(content)


def test_a_rerun_that_is_the_same_run_and_each_way_one_can_differ(tmp_path):
    final = {"eval_success_rate": 0.7, "eval_greedy_success_rate": 0.7}
    first, second = tmp_path / "x-seed0", tmp_path / "x-seed0-rerun"
    _run(first, final, seconds=600.0)
    _run(second, final, seconds=655.0)  # the wall time is the machine's
    lines = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    lines[1]["peak_rss_gb"], lines[1]["update_seconds"] = 3.9, 12.5  # so are memory and timings
    (second / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = json.loads((second / "config.json").read_text())
    (second / "config.json").write_text(json.dumps({**config, "out": str(second)}))  # where it ran is not a setting
    _with_weights(first, b"same")
    _with_weights(second, b"same")
    assert sweep.run_differences(str(first), str(second)) == ([], True)
    text, same = sweep.rerun_report("x", [0], {0: str(first)})
    assert same and "seed 0: the same run: 3 metrics.jsonl lines" in text and "sha256 equal" in text

    # a field of the run's own
    lines[2]["eval_success_rate"] = 0.705
    (second / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sweep.run_differences(str(first), str(second))[0] == ["metrics.jsonl line 3: eval_success_rate"]
    assert "**the rerun differs**" in sweep.rerun_report("x", [0], {0: str(first)})[0]
    lines[2]["eval_success_rate"] = 0.7
    (second / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    # the weights
    (second / "model" / "model.safetensors").write_bytes(b"moved")
    assert sweep.run_differences(str(first), str(second)) == (["the saved weights (sha256)"], True)
    # a setting
    (second / "model" / "model.safetensors").write_bytes(b"same")
    (second / "config.json").write_text(json.dumps({**config, "lr": 1e-3}))
    assert sweep.run_differences(str(first), str(second))[0] == ["config.json: lr"]
    # a line missing: the rerun stopped early
    (second / "config.json").write_text(json.dumps(config))
    (second / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    assert sweep.run_differences(str(first), str(second))[0] == ["metrics.jsonl: 3 lines against 2"]


def test_rerun_trains_each_finished_seed_again_and_exits_1_when_it_differs(tmp_path, monkeypatch, capsys):
    final = {"eval_success_rate": 0.7, "eval_greedy_success_rate": 0.7}
    _run(tmp_path / "x-seed0", final)
    _run(tmp_path / "x-seed1", final)
    trained = []

    def fake_run_seed(seed, out, eval_set, extra, experiment=None):  # the CLI's run, as a copy of the first (seed 1's a different one)
        trained.append((seed, os.path.basename(out), extra))
        _run(Path(out), final if seed == 0 else {**final, "eval_success_rate": 0.1})

    monkeypatch.setattr(sweep, "run_seed", fake_run_seed)
    assert sweep.main(["--seeds", "0", "1", "--name", "x", "--out", str(tmp_path), "--rerun", "--", "--updates", "2"]) == 1
    assert trained == [(0, "x-seed0-rerun", ["--updates", "2"]), (1, "x-seed1-rerun", ["--updates", "2"])]
    text = (tmp_path / "x-rerun.md").read_text()
    assert "seed 0: the same run" in text and "weights not compared" in text and "seed 1: **the rerun differs**" in text
    trained.clear()
    assert sweep.main(["--seeds", "0", "--name", "x", "--out", str(tmp_path), "--rerun"]) == 0  # finished: read back
    assert trained == []
    with pytest.raises(SystemExit) as stopped:
        sweep.main(["--seeds", "0", "--name", "x", "--out", str(tmp_path), "--rerun", "--report-only"])
    assert stopped.value.code == 2 and "--rerun trains" in capsys.readouterr().err


def test_a_run_of_some_seeds_keeps_the_sweeps_other_finished_seeds_in_its_table(tmp_path):
    """NAME.md once held the seeds of the last command alone: ``--seeds 5`` after a sweep of 0-4 wrote a table
    of seed 5 over the five. Other finished seeds of the sweep, with its settings, stay; one of other settings is
    named, not counted; a rerun folder is not a seed."""
    done = {"eval_success_rate": 0.8, "eval_greedy_success_rate": 0.8}
    for seed in (0, 1, 5):
        _run(tmp_path / f"x-seed{seed}", done)
    _run(tmp_path / "x-seed0-rerun", done)
    _run(tmp_path / "x-seed7", done)
    (tmp_path / "x-seed7" / "config.json").write_text(json.dumps({"steps": 2, "lr": 1e-3}))
    _run(tmp_path / "y-seed3", done)  # another sweep
    assert sweep.main(["--seeds", "5", "--name", "x", "--out", str(tmp_path), "--report-only"]) == 0
    text = (tmp_path / "x.md").read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows == ["0", "1", "5", "median [range]"]
    assert "seeds 0, 1, 5 " in text and "3 of 3 runs finished" in text
    assert "Left out of this table, finished with other settings than the seeds above: x-seed7 (other settings: lr)." in text


def test_an_experiment_file_runs_over_the_seeds_as_a_copy_with_each_seed(tmp_path, monkeypatch, capsys):
    """``gem-core train --experiment`` refuses ``--seed`` beside it (the file says what the run is), so a sweep of a
    file runs a copy a seed: the file with only its seed changed, beside the run, continued with --resume where a
    checkpoint is; an edited file mid-sweep is refused, not mixed in; a bad file is one line."""
    from gem_core.experiment import load_experiment

    source = Path(__file__).resolve().parents[2] / "examples" / "experiments" / "portable.toml"
    commands = []

    def fake_subprocess_run(command, cwd):  # the CLI's run: records its command, leaves a finished run
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        if out.exists():  # the resumed one
            for name in os.listdir(out):
                os.remove(out / name)
            out.rmdir()
        _run(out, {"eval_success_rate": 0.6, "eval_greedy_success_rate": 0.6})
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(sweep.subprocess, "run", fake_subprocess_run)
    (tmp_path / "p-seed101").mkdir()
    (tmp_path / "p-seed101" / "checkpoint.pt").write_bytes(b"")  # stopped part way: continued
    assert sweep.main(["--seeds", "100", "101", "--name", "p", "--out", str(tmp_path), "--eval-set", "validation", "--experiment", str(source)]) == 0
    assert len(commands) == 2
    for seed, command in zip((100, 101), commands):
        copy = tmp_path / f"p-seed{seed}.toml"
        assert command[3:] == [
            "train",
            "--experiment",
            str(copy),
            "--eval-set",
            "validation",
            "--out",
            str(tmp_path / f"p-seed{seed}"),
            *(["--resume"] if seed == 101 else []),
        ]
        assert "--seed" not in command
        assert load_experiment(copy) == dataclasses.replace(load_experiment(source), seed=seed)
    table = (tmp_path / "p.md").read_text()
    assert "seeds 100, 101 " in table and f"`gem-core train --experiment p-seedS.toml --eval-set validation` (`{source}` with seed S)" in table
    # the file edited mid-sweep: the next seed's copy is written anew, an old one that differs is refused
    edited = tmp_path / "edited.toml"
    edited.write_text(source.read_text().replace("lr = 1e-4", "lr = 3e-4"))
    assert load_experiment(edited) != load_experiment(source)
    for args in ([], ["--report-only"]):  # seed 100 finished: not read back into the edited file's table either
        with pytest.raises(SystemExit) as refused:
            sweep.main(["--seeds", "100", "--name", "p", "--out", str(tmp_path), "--experiment", str(edited), *args])
        assert "p-seed100.toml holds another experiment" in str(refused.value.code)
    (tmp_path / "p-seed101" / "metrics.jsonl").unlink()  # unfinished: refused before it would train again
    with pytest.raises(SystemExit) as refused:
        sweep.main(["--seeds", "101", "--name", "p", "--out", str(tmp_path), "--experiment", str(edited)])
    assert "p-seed101.toml holds another experiment" in str(refused.value.code) and len(commands) == 2
    (tmp_path / "bad.toml").write_text("[optimizer]\nlr = -1\n")
    with pytest.raises(SystemExit) as bad:
        sweep.main(["--seeds", "100", "--name", "q", "--out", str(tmp_path), "--experiment", str(tmp_path / "bad.toml")])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "--experiment:" in err and "optimizer.lr" in err and "Traceback" not in err
