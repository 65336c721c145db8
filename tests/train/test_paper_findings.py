"""benchmarks/paper_findings.py counts a run for an arm only when the run's config.json is that arm's
in every setting that shapes a run (estimator, gamma, group size, seed, the scale's settings and model, and
today's defaults): a finished run of other settings in the arm's directory once counted. Its intervals and
verdicts, against hand-computed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.scripts import script_module  # noqa: E402
from gem_core.train.config import evaluation_seeds  # noqa: E402
from gem_core.train.trainer import TINY_RUN, TrainConfig, config_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def findings():
    with script_module(ROOT / "benchmarks" / "paper_findings.py") as module:
        yield module


def _finished_run(directory: Path, steps: int, final: float = 0.3, turns: float | None = 3.0, train: tuple = (0.2, 0.4), **config) -> None:
    """A run directory as `gem-core train` leaves it: config.json, an evaluation after the warm start, one
    training record per RL update (``train``: their success rates) and an evaluation after ``steps`` updates."""
    directory.mkdir(parents=True)
    settings = TrainConfig(**config)
    seeds = evaluation_seeds(settings.env_ids[0], settings.env_kwargs, settings.eval_episodes, settings.eval_set)
    saved = {**config_dict(settings), "weights": {"source": "built here", "files": {}}, "evaluation": {"set": settings.eval_set, "seeds": seeds}}
    (directory / "config.json").write_text(json.dumps(saved))
    lines = [{"step": 0, "phase": "warm_start", "eval_success_rate": 0.1, "eval_turns_when_solved": None}]
    lines += [{"step": i + 1, "phase": "rl", "success_rate": rate} for i, rate in enumerate(train)]
    lines.append({"step": steps, "phase": "rl", "eval_success_rate": final, "eval_greedy_success_rate": final, "eval_turns_when_solved": turns})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _tiny_extra() -> dict:
    extra = dict(TINY_RUN)
    extra.pop("updates")
    return extra


def test_a_reinforce_run_does_not_count_for_the_rebn_arm(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    _finished_run(directory, 300, **extra, estimator="reinforce", gamma=0.5, seed=0)
    expected = findings.arm_config(rebn, 0, extra)
    assert not findings.finished(str(directory), 300, expected)
    assert {m.split(":")[0] for m in findings.mismatches(str(directory), expected)} == {"estimator", "gamma"}


@pytest.mark.parametrize(
    "change, field",
    [({"seed": 1}, "seed"), ({"model": TrainConfig.model}, "model"), ({"episodes_per_update": 32}, "episodes_per_update"), ({"gamma": 0.999}, "gamma")],
)
def test_a_run_of_another_seed_model_or_scale_does_not_count(findings, tmp_path, change, field):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    _finished_run(directory, 300, **{**extra, "estimator": "rebn", "gamma": 0.9, "seed": 0, **change})
    expected = findings.arm_config(rebn, 0, extra)
    assert not findings.finished(str(directory), 300, expected)
    assert [m.split(":")[0] for m in findings.mismatches(str(directory), expected)] == [field]


def test_the_arms_own_finished_run_counts_and_directories_name_the_scale(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    assert directory.name == "tiny-rebn-0.9-seed0" and findings.run_dir(str(tmp_path), rebn, 0, "real").endswith("real-rebn-0.9-seed0")
    _finished_run(directory, 300, **extra, estimator="rebn", gamma=0.9, seed=0)
    assert findings.finished(str(directory), 300, findings.arm_config(rebn, 0, extra))
    assert not findings.finished(str(directory), 200, findings.arm_config(rebn, 0, extra))  # not that far
    real = findings.arm_config(rebn, 0, {})
    assert real["model"] == TrainConfig.model and not findings.finished(str(directory), 300, real)


def test_a_run_of_an_older_default_does_not_count_at_the_real_scale(findings, tmp_path):
    """The real scale sets nothing but the arm's fields: a run saved before a default changed (here every
    weight trained, as before --train-layers) is not today's default run."""
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "real"))
    _finished_run(directory, 30, estimator="rebn", gamma=0.9, seed=0, trained_layers=0)
    expected = findings.arm_config(rebn, 0, {})
    assert [m.split(":")[0] for m in findings.mismatches(str(directory), expected)] == ["trained_layers"]
    assert not findings.finished(str(directory), 30, expected)


def test_where_a_run_was_written_and_its_checkpoints_do_not_matter(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "real"))
    _finished_run(directory, 30, estimator="rebn", gamma=0.9, seed=0, out="elsewhere", checkpoint_every=1)
    assert findings.finished(str(directory), 30, findings.arm_config(rebn, 0, {}))


def test_the_grpo_arm_plays_groups_and_a_single_episode_run_is_not_it(findings, tmp_path):
    grpo = next(arm for arm in findings.ARMS if arm.estimator == "grpo")
    assert grpo.group_size > 1 and TrainConfig(**findings.arm_settings(grpo, 0, {})).group_size == grpo.group_size
    directory = Path(findings.run_dir(str(tmp_path), grpo, 0, "real"))
    _finished_run(directory, 30, estimator="grpo", gamma=0.9, seed=0, group_size=2)
    assert [m.split(":")[0] for m in findings.mismatches(str(directory), findings.arm_config(grpo, 0, {}))] == ["group_size"]


def test_the_interval_is_students_t_over_seeds(findings):
    # mean 0.5, sample std 0.1, n 3: half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    low, high = findings.interval([0.4, 0.5, 0.6])
    assert low == pytest.approx(0.5 - 0.24843, abs=1e-4) and high == pytest.approx(0.5 + 0.24843, abs=1e-4)
    assert findings.interval([0.4]) is None
    assert findings.summary([0.4, 0.5, 0.6]) == "0.500 [0.252, 0.748]"
    assert findings.summary([0.4, None]) == "0.400 (n=1)" and findings.summary([None, None]) == "-"


def test_the_sign_test_is_the_exact_two_sided_binomial(findings):
    assert findings.sign_test([0.1] * 6) == (6, 6, pytest.approx(2 / 64))  # the fewest seeds that can reach 5%
    assert findings.sign_test([0.1] * 5)[2] == pytest.approx(2 / 32) and findings.sign_test([0.1] * 5)[2] > findings.ALPHA
    assert findings.sign_test([0.1, 0.2, 0.3, 0.1, 0.2, -0.1]) == (5, 6, pytest.approx(2 * 7 / 64))  # 5 of 6: p 0.219
    assert findings.sign_test([0.1, 0.0, 0.2, 0.1, 0.3, 0.1, 0.2]) == (6, 6, pytest.approx(2 / 64))  # a tie is dropped
    assert findings.sign_test([-0.1] * 8) == (0, 8, pytest.approx(2 / 256))
    assert findings.sign_test([0.0, 0.0]) == (0, 0, 1.0)
    assert len(findings.SEEDS) == 6 and findings.sign_test([1.0] * len(findings.SEEDS))[2] < findings.ALPHA


@pytest.mark.parametrize(
    "reference, other, direction, verdict",
    [
        ([0.6, 0.7, 0.65, 0.62, 0.61, 0.7], [0.4, 0.45, 0.42, 0.5, 0.5, 0.4], +1, "reproduces"),  # ReBN higher on every seed
        ([0.4, 0.45, 0.42, 0.5, 0.5, 0.4], [0.6, 0.7, 0.65, 0.62, 0.61, 0.7], +1, "the opposite"),
        ([0.6, 0.7, 0.65], [0.4, 0.45, 0.42], +1, "not shown"),  # every seed, but three seeds: p = 0.25
        ([0.9, 0.7, 0.65, 0.62, 0.61, 0.3], [0.4, 0.45, 0.42, 0.5, 0.5, 0.4], +1, "not shown"),  # 5 of 6: p = 0.22, whatever the mean
        ([2.9, 3.0, 2.95, 3.1, 3.0, 2.8], [3.4, 3.5, 3.45, 3.5, 3.6, 3.2], -1, "reproduces"),  # fewer turns with the smaller gamma
        ([0.6, None, 0.7, 0.5], [0.5, 0.4, None, 0.5], +1, "not shown"),  # seeds 0 and 3 have both: one win, one tie
    ],
)
def test_the_verdict_is_the_sign_tests_at_5_percent_the_papers_way(findings, reference, other, direction, verdict):
    assert findings.paired_difference(reference, other, direction).endswith("| " + verdict)


def test_the_comparison_shows_every_seeds_difference_the_interval_and_the_test(findings):
    text = findings.paired_difference([0.6, 0.7, 0.65, 0.62, 0.61, 0.7], [0.4, 0.45, 0.42, 0.5, 0.5, 0.4], +1)
    per_seed, mean, test, verdict = text.split(" | ")
    assert per_seed == "+0.200, +0.250, +0.230, +0.120, +0.110, +0.300"
    assert mean.startswith("0.202 [") and test == "6 of 6 the paper's way, p = 0.031" and verdict == "reproduces"


def test_tables_read_each_seeds_run(findings, tmp_path):
    """The tables from six seeds of each arm written here: the numbers are the runs', the verdicts follow."""
    seeds = list(findings.SEEDS)
    for arm in findings.ARMS:
        for seed in seeds:
            better = arm.name == "rebn-0.9"
            _finished_run(
                Path(findings.run_dir(str(tmp_path), arm, seed, "real")),
                30,
                final=(0.6 + 0.01 * seed) if better else (0.4 + 0.02 * seed),
                turns=(3.9 + 0.01 * seed) if arm.gamma == 0.9 else (5.6 - 0.01 * seed),
                train=(0.3, 0.5) if better else (0.2, 0.2),
                **findings.arm_settings(arm, seed, {}),
            )
    text = findings.tables(str(tmp_path), seeds, "real")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["rebn-0.9"].split(" | ")[2].startswith("0.625 [")  # final, sampled: 0.60 .. 0.65
    assert rows["rebn-0.9"].split(" | ")[4].startswith("0.400 [")  # the training batches' mean: (0.3 + 0.5) / 2
    assert rows["grpo-g4"].split(" | ")[2].startswith("0.450 [")
    # every seed's run beside the means, each in its seed's column (finding (2) its turns per solved episode as well)
    assert rows["rebn-0.9: success"] == "| rebn-0.9: success | 0.600 | 0.610 | 0.620 | 0.630 | 0.640 | 0.650 |"
    assert rows["grpo-g4: success"] == "| grpo-g4: success | 0.400 | 0.420 | 0.440 | 0.460 | 0.480 | 0.500 |"
    assert rows["rebn-0.999-n20: turns per solved episode"] == "| rebn-0.999-n20: turns per solved episode | 5.600 | 5.590 | 5.580 | 5.570 | 5.560 | 5.550 |"
    assert "rebn-0.9: turns per solved episode" not in rows  # finding (1)'s measure is success alone
    assert rows["rebn-0.9 - reinforce-0.9"].endswith("| 6 of 6 the paper's way, p = 0.031 | reproduces |")
    assert rows["rebn-0.9 - grpo-g4"].endswith("| reproduces |")
    assert rows["rebn-0.9-n20 - rebn-0.999-n20"].endswith("| reproduces |")  # 3.90-3.95 turns against 5.55-5.60
    assert "rebn-0.9 - rebn-0.999 " not in text  # the easy game's gamma arm is in no finding now
    # finding (2)'s scripted players on its held-out episodes (the fake run records none: the linear scan alone)
    assert rows["linear scan from the bottom"] == "| linear scan from the bottom | 1.000 | 10.50 |"
    only_one = findings.tables(str(tmp_path), seeds, "real", tuple(a for a in findings.ARMS if a.name != "grpo-g4"))
    assert "grpo-g4" not in only_one and "(2) gamma" in only_one and "(1) ReBN" in only_one  # the comparisons of the arms run
    assert "| rebn-0.9 - reinforce-0.9 |" in only_one
    assert "(1) ReBN" not in findings.tables(str(tmp_path), seeds, "real", tuple(a for a in findings.ARMS if a.name == "rebn-0.9"))


def test_a_run_saved_without_its_evaluation_seeds_gets_them_worked_out_again(findings, tmp_path):
    arm = next(a for a in findings.ARMS if a.name == "rebn-0.9-n20")
    directory = tmp_path / "old"
    _finished_run(directory, 30, **findings.arm_settings(arm, 0, {}))
    saved = json.loads((directory / "config.json").read_text())
    del saved["evaluation"]
    (directory / "config.json").write_text(json.dumps(saved))
    assert findings.scripted_players(str(directory)) == [("linear scan from the bottom", 1.0, 10.5)]


def test_finding_2_plays_the_long_game_and_its_linear_scan_is_the_envs(findings):
    arm = next(a for a in findings.ARMS if a.name == "rebn-0.999-n20")
    config = TrainConfig(**findings.arm_settings(arm, 3, {}))
    assert config.env_ids == ("game:GuessTheNumber-v0",) and config.gamma == 0.999 and config.seed == 3
    assert TrainConfig(**findings.arm_settings(findings.ARMS[0], 3, {})).env_ids == TrainConfig().env_ids
    # every target of 1-20 once: the scan solves each in target turns; on the easy game's 4 turns, targets 1-4 only
    assert findings.linear_scan("game:GuessTheNumber-v0", evaluation_seeds("game:GuessTheNumber-v0", {}, 20)) == (1.0, 10.5)
    assert findings.linear_scan("game:GuessTheNumber-v0-easy", evaluation_seeds("game:GuessTheNumber-v0-easy", {}, 10)) == (0.4, 2.5)


def test_read_runs_counts_a_finished_run_of_the_arms_settings_and_nothing_else(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    sweep = tmp_path / "sweep"
    _finished_run(sweep / "default-seed0", 40, final=0.7, **findings.arm_settings(rebn, 0, {}))
    _finished_run(sweep / "other-seed1", 40, final=0.7, **{**findings.arm_settings(rebn, 1, {}), "lr": 1e-3})
    out = tmp_path / "out"
    assert findings.copy_finished([str(sweep)], str(out), rebn, 0, 40, {}, "real") == str(sweep / "default-seed0")
    copied = Path(findings.run_dir(str(out), rebn, 0, "real"))
    assert (copied / "read_from.txt").read_text().strip() == str(sweep / "default-seed0")
    assert findings.finished(str(copied), 40, findings.arm_config(rebn, 0, {}))
    assert findings.copy_finished([str(sweep)], str(out), rebn, 1, 40, {}, "real") is None  # another lr: not the arm's run
    assert findings.copy_finished([str(sweep)], str(out), rebn, 0, 40, {}, "real") is None  # already there


def test_the_figure_is_drawn_from_the_runs(findings, tmp_path):
    pytest.importorskip("matplotlib")
    arms = tuple(a for a in findings.ARMS if a.name in ("rebn-0.9", "rebn-0.999"))
    for arm in arms:
        for seed in (0, 1):
            directory = Path(findings.run_dir(str(tmp_path), arm, seed, "real"))
            _finished_run(directory, 30, train=tuple(0.1 * (i % 7) for i in range(30)), **findings.arm_settings(arm, seed, {}))
    png = tmp_path / "findings.png"
    findings.plot(str(tmp_path), [0, 1], str(png), "real", arms)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("allowed, jobs, threads", [(8, 1, 8), (8, 2, 4), (8, 3, 2), (8, 16, 1), (1, 1, 1)])
def test_jobs_share_the_cores_out_as_each_runs_torch_threads(findings, tmp_path, monkeypatch, allowed, jobs, threads):
    """``--jobs 1`` gives the one run every core it may use (as gem-core train runs); more runs at once share them.
    The cores are the process's affinity, not the machine's: pinned to one core (``taskset -c 1``, a run beside
    another), a run gets one thread however many the machine has."""
    calls = []

    class InOrder:  # the pool, run in this process: what each run is asked for is what counts here
        def __init__(self, workers):
            calls.append(("workers", workers))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            class Done:
                def result(self):
                    return fn(*args)

            return Done()

    monkeypatch.setattr(findings.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(findings.os, "sched_getaffinity", lambda pid: set(range(allowed)), raising=False)
    monkeypatch.setattr(findings, "ProcessPoolExecutor", InOrder)
    monkeypatch.setattr(findings, "train_one", lambda out, arm, seed, steps, extra, scale, threads: calls.append((arm.name, seed, threads)))
    monkeypatch.setattr(findings, "tables", lambda *a, **k: "")
    monkeypatch.setattr(findings, "plot", lambda *a, **k: None)
    assert findings.main(["--arms", "rebn-0.9", "--seeds", "0", "1", "--jobs", str(jobs), "--out", str(tmp_path)]) == 0
    assert calls == [("workers", jobs), ("rebn-0.9", 0, threads), ("rebn-0.9", 1, threads)]


def test_report_only_names_the_runs_not_there_and_gives_no_verdict_until_every_seed_is_in(findings, tmp_path, monkeypatch, capsys):
    """``--report-only`` trains nothing and counts a finished run of the arm's settings alone: a run still
    training, or one of other settings, is named as not there, and a comparison short of a seed has no verdict
    (six wins in six would be 'reproduces'; five of six seeds with every win is 'none yet')."""
    pytest.importorskip("matplotlib")
    by_name = {arm.name: arm for arm in findings.ARMS}
    steps = TrainConfig.updates
    for seed in findings.SEEDS:
        _finished_run(
            Path(findings.run_dir(str(tmp_path), by_name["rebn-0.9"], seed, "real")), steps, final=0.8, **findings.arm_settings(by_name["rebn-0.9"], seed, {})
        )
    for seed in range(4):
        _finished_run(
            Path(findings.run_dir(str(tmp_path), by_name["reinforce-0.9"], seed, "real")),
            steps,
            final=0.5,
            **findings.arm_settings(by_name["reinforce-0.9"], seed, {}),
        )
    still_training = Path(findings.run_dir(str(tmp_path), by_name["reinforce-0.9"], 4, "real"))  # no evaluation after the last update yet
    _finished_run(still_training, steps - 1, final=0.99, **findings.arm_settings(by_name["reinforce-0.9"], 4, {}))
    other_settings = Path(findings.run_dir(str(tmp_path), by_name["reinforce-0.9"], 5, "real"))
    _finished_run(other_settings, steps, final=0.99, **{**findings.arm_settings(by_name["reinforce-0.9"], 5, {}), "lr": 1e-3})

    def no_training(*args, **kwargs):
        raise AssertionError("--report-only trained a run")

    monkeypatch.setattr(findings, "train_one", no_training)
    assert findings.main(["--finding", "1", "--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "finding1.md").read_text()
    assert "Not run yet (or not finished): reinforce-0.9 seeds 4, 5; grpo-g4 seeds 0, 1, 2, 3, 4, 5." in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["reinforce-0.9"].split(" | ")[2] == "0.500 [0.500, 0.500] (n=4)"  # neither the unfinished run's 0.99 nor the other lr's
    assert rows["rebn-0.9 - reinforce-0.9"].endswith("| 4 of 4 the paper's way, p = 0.125 | none yet: 2 seeds still to run |")
    assert rows["grpo-g4"] == "| grpo-g4 | - | - | - | - | - |"
    assert (tmp_path / "finding1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the arms with runs, grpo-g4 left out
    for seed in (4, 5):  # every seed in: the verdict the test gives
        directory = Path(findings.run_dir(str(tmp_path), by_name["reinforce-0.9"], seed, "real"))
        for record in directory.iterdir():
            record.unlink()
        directory.rmdir()
        _finished_run(directory, steps, final=0.5, **findings.arm_settings(by_name["reinforce-0.9"], seed, {}))
    assert findings.main(["--finding", "1", "--report-only", "--out", str(tmp_path)]) == 0
    written = (tmp_path / "finding1.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in written.splitlines() if line.startswith("| ")}
    assert rows["rebn-0.9 - reinforce-0.9"].endswith("| 6 of 6 the paper's way, p = 0.031 | reproduces |")
    # finding (2)'s report, none of its runs there, writes its own file and leaves finding (1)'s as it was
    assert findings.main(["--finding", "2", "--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "finding1.md").read_text() == written and "ReBN vs vanilla" not in (tmp_path / "finding2.md").read_text()
    assert "Not run yet (or not finished): rebn-0.9-n20 seeds 0, 1, 2, 3, 4, 5" in (tmp_path / "finding2.md").read_text()
    assert not (tmp_path / "finding2.png").exists() and not (tmp_path / "findings.md").exists()


def test_arms_of_no_finding_write_no_table_and_say_so(findings, tmp_path, monkeypatch, capsys):
    """``--arms`` without a finding's reference and a compared arm (rebn-0.999 is in none): one line, no file."""
    monkeypatch.setattr(findings, "train_one", lambda *a, **k: None)
    assert findings.main(["--arms", "rebn-0.999", "--report-only", "--out", str(tmp_path)]) == 0
    assert "no finding has its reference arm and a compared arm among these arms: no table written" in capsys.readouterr().out
    assert not list(tmp_path.glob("finding*"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps and --jobs must be >= 1"),
        (["--seeds", "-1"], "seeds >= 0"),
        (["--read-runs", "no/such/folder"], "--read-runs no/such/folder: no such folder"),
        (["--set", "lr=fast"], "the value must be JSON"),
        (["--set", "no_such_field=1"], "--set:"),
        (["--out", "FILE"], "a file, not a folder"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(findings, tmp_path, capsys, argv, message):
    (tmp_path / "FILE").write_text("")
    argv = [str(tmp_path / "FILE") if a == "FILE" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        findings.main([*argv, "--report-only"] + ([] if "--out" in argv else ["--out", str(tmp_path / "out")]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
