"""--resume: a run killed at a random point and resumed ends with the same file as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from eval_support import HARD, binary_search, read_lines, without_timing

from gem_core.cli import main
from gem_core.eval.plan import plan
from gem_core.eval.results import ResultsError, ResultsFile, read_results
from gem_core.testing import FakeChatServer

EPISODES = 40
CLI = [sys.executable, "-c", "import sys; from gem_core.cli import main; sys.exit(main(sys.argv[1:]))"]


def slow_binary_search(messages):
    time.sleep(0.01)  # so that the run is still going when it is killed
    return binary_search(messages)


def _args(base_url: str, out: os.PathLike, *extra: str) -> list[str]:
    return ["eval", HARD, "--base-url", base_url, "--model", "m", "--episodes", str(EPISODES), "--concurrency", "4", "--out", str(out), *extra]


def _count_lines(path) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except FileNotFoundError:
        return 0


def test_a_killed_run_resumed_equals_an_uninterrupted_one(tmp_path, capsys):
    kill_after = random.randint(1, EPISODES - 5)
    killed, whole = tmp_path / "killed.jsonl", tmp_path / "whole.jsonl"
    with FakeChatServer(slow_binary_search) as server:
        process = subprocess.Popen([*CLI, *_args(server.base_url, killed, "--no-progress")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while _count_lines(killed) < kill_after and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        assert process.returncode == -signal.SIGKILL, (process.returncode, process.stderr.read())
        process.stderr.close()
        written = read_lines(killed)  # every line whole
        assert kill_after <= len(written) < EPISODES, (kill_after, len(written))
        assert main(_args(server.base_url, killed, "--resume")) == 0
        resumed_out = capsys.readouterr().out
        assert main(_args(server.base_url, whole)) == 0
    final, reference = read_lines(killed), read_lines(whole)
    assert len(final) == EPISODES and len({line["seed"] for line in final}) == EPISODES  # no duplicate, none missing
    assert without_timing(final) == without_timing(reference), f"killed after {kill_after} lines"
    assert f"({EPISODES - len(written)} played now)" in resumed_out


def test_a_cut_off_last_line_is_dropped_and_played_again(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with FakeChatServer(binary_search) as server:
        assert main(_args(server.base_url, out)) == 0
        lines = out.read_text().splitlines(keepends=True)
        out.write_text("".join(lines[:10]) + lines[10][: len(lines[10]) // 2])  # a write cut short
        assert len(read_results(out)[0]) == 10
        assert main(_args(server.base_url, out, "--resume")) == 0
    assert out.read_text() != "" and without_timing(read_lines(out)) == without_timing([json.loads(line) for line in lines])
    assert f"({EPISODES - 10} played now)" in capsys.readouterr().out


def test_resume_refuses_another_models_file_and_an_existing_file_without_it(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with FakeChatServer(binary_search) as server:
        assert main(["eval", HARD, "--base-url", server.base_url, "--model", "a", "--episodes", "3", "--out", str(out)]) == 0
        assert main(["eval", HARD, "--base-url", server.base_url, "--model", "b", "--episodes", "3", "--out", str(out), "--resume"]) == 2
        assert "holds results of 'a', not 'b'" in capsys.readouterr().err
        assert main(["eval", HARD, "--base-url", server.base_url, "--model", "a", "--episodes", "3", "--out", str(out)]) == 2
        assert "--resume continues it, --overwrite replaces it" in capsys.readouterr().err
        assert main(["eval", HARD, "--base-url", server.base_url, "--model", "a", "--episodes", "2", "--out", str(out), "--resume"]) == 2
        assert "would not play" in capsys.readouterr().err  # fewer episodes than the file holds
        assert main(["eval", HARD, "--base-url", server.base_url, "--model", "a", "--episodes", "5", "--out", str(out), "--resume"]) == 0
    assert [line["seed"] for line in read_lines(out)] == [0, 1, 2, 3, 4]  # extended


def test_a_line_that_is_not_a_result_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"env_id": "x"}\n')
    with pytest.raises(ResultsError, match="line 1: not a gem-core eval result"):
        ResultsFile.open(path, resume=True)


def test_finish_writes_one_line_per_planned_episode_in_plan_order(tmp_path):
    jobs = plan([HARD], 3)
    path = tmp_path / "r.jsonl"
    results = ResultsFile.open(path, resume=False)
    from gem_core.eval.results import EpisodeResult

    def result(seed: int, error: str | None) -> EpisodeResult:
        return EpisodeResult(HARD, seed, None, seed, "m", error is None, 1.0, 1, 0, None, None, True, None, "stop", error, 0.1)

    for seed, error in ((2, None), (0, "boom"), (1, None), (0, None)):  # episode 0 replayed after an error
        results.append(result(seed, error))
    assert _count_lines(path) == 4
    final = results.finish(jobs)
    assert [(r.seed, r.error) for r in final] == [(0, None), (1, None), (2, None)]
    assert [line["seed"] for line in read_lines(path)] == [0, 1, 2]
