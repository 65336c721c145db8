"""Two processes on CPU (gloo). GemRollout makes the same number of collective generate calls and forwards on
every rank, though the ranks' episodes take different numbers of turns, and plays what one process plays;
then one step of TRL's own train() on both, whose loss sees ReBN with statistics over both processes.

Each process is TRL's own GRPOTrainer (its accelerator joins the process group) over a tiny model whose
every forward is a collective (two_ranks.py), as under FSDP or ZeRO-3; a rank that made more forwards
than the other would wait forever, so the test gives the rollouts a deadline and kills the processes.

And TRL's own environment pool (``environment_factory``, rows without a ``seed`` column) over two ranks, run
twice: every reset of every instance, step and rank plays its own episode, the same in both runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import two_ranks
import two_ranks_environments

HERE = Path(__file__).resolve().parent
SETUP_SECONDS = 420  # import TRL and build the trainer, on a busy 2-core machine
ROLLOUT_SECONDS = 240  # the rollouts take seconds, the train step tens of seconds on a busy machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(paths: list[Path], procs: list[subprocess.Popen], seconds: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.poll() is not None and p.returncode != 0]
        if failed:
            pytest.fail(f"rank {failed[0][0]} exited with {failed[0][1]} before {what}:\n{logs[failed[0][0]].read_text()[-3000:]}")
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            pytest.fail(
                f"{what} not done within {seconds:.0f} s (missing {missing}): the ranks are stuck in a collective call, "
                f"one waiting for calls the other never makes.\nrank 0 log tail:\n{logs[0].read_text()[-1500:]}"
            )
        time.sleep(0.2)


def _start_two_ranks(script: str, out_dir: Path) -> tuple[list[subprocess.Popen], list[Path]]:
    """``script`` as ranks 0 and 1 of a gloo job (torchrun's variables), each logging to ``out_dir/rank-R.log``."""
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    logs = [out_dir / f"rank-{r}.log" for r in range(2)]
    procs = []
    for rank in range(2):
        with open(logs[rank], "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / script), str(out_dir)],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs, logs


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ranks_make_equal_collective_calls_and_play_the_one_process_episodes(tmp_path, tokenizer):
    procs, logs = _start_two_ranks("two_ranks.py", tmp_path)
    try:
        _wait([tmp_path / f"ready-{r}" for r in range(2)], procs, SETUP_SECONDS, "building the trainers", logs)
        _wait([tmp_path / f"rank-{r}.json" for r in range(2)], procs, ROLLOUT_SECONDS, "the rollouts and the train step", logs)
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        _stop(procs)
    results = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]

    # the ranks' episodes took different numbers of turns, yet both made the same calls
    turns = [r["fields"]["gem_num_turns"] for r in results]
    assert turns == [list(t) for t in two_ranks.TURNS_BY_RANK]
    assert max(turns[0]) != max(turns[1])
    assert results[0]["generate_calls"] == results[1]["generate_calls"] == two_ranks.EXPECTED_GENERATE_CALLS
    assert results[0]["forwards"] == results[1]["forwards"] > two_ranks.EXPECTED_GENERATE_CALLS

    # and each rank played what one process plays on the same rows (same model, greedy)
    trainer, counter = two_ranks.build(str(tmp_path / "reference"), tokenizer)
    for rank, result in enumerate(results):
        expected = json.loads(json.dumps(two_ranks.play(trainer, rank)))
        got = result["fields"]
        assert set(got) == set(expected)
        for key, value in expected.items():
            if key == "logprobs":
                for a, b in zip(got[key], value):
                    assert a == pytest.approx(b, abs=1e-6), rank
            else:
                assert got[key] == value, (rank, key)
    # one process alone makes no idle calls: rank 0's 2 rounds (2 + 1 calls), then rank 1's 4 (2 + 1 + 1 + 1)
    assert counter.generates == 3 + 5

    # one step of TRL's train() on both processes: the same generate calls, ReBN over both ranks' episodes
    steps = [r["train"] for r in results]
    assert [s["global_step"] for s in steps] == [1, 1] and [s["rows"] for s in steps] == [4, 4] and steps[0]["episodes"] == 8
    assert max(steps[0]["turns"]) != max(steps[1]["turns"]), "TRL's sampler (seed 0) gave the ranks episodes of different lengths"
    assert steps[0]["generate_calls"] == steps[1]["generate_calls"] > 0
    assert all(s["advantages_max_abs_diff"] <= 1e-6 for s in steps), steps
    assert any(s["nonzero_advantages"] for s in steps)


def _environment_run(out_dir: Path) -> list[dict]:
    """One two-rank run of two_ranks_environments.py; each rank's recorded resets."""
    out_dir.mkdir()
    procs, logs = _start_two_ranks("two_ranks_environments.py", out_dir)
    try:
        _wait([out_dir / f"resets-{r}.json" for r in range(2)], procs, SETUP_SECONDS + ROLLOUT_SECONDS, "two steps with environment_factory", logs)
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        _stop(procs)
    return [json.loads((out_dir / f"resets-{r}.json").read_text()) for r in range(2)]


def test_environment_factory_rows_without_a_seed_play_distinct_reproducible_episodes(tmp_path):
    """TRL 1.16 hands its pooled instances out in order and resets each once per batch: without a seed column,
    every instance, every step and every rank must still get its own episode, and a rerun the same ones."""
    module = two_ranks_environments
    first, second = _environment_run(tmp_path / "first"), _environment_run(tmp_path / "second")
    per_rank = module.STEPS * module.PER_DEVICE_BATCH
    for result in first:
        assert result["global_step"] == module.STEPS and result["probed"] == 0
        assert len(result["resets"]) == per_rank  # one reset per rollout: 2 steps of 4
        assert sorted({r["instance"] for r in result["resets"]}) == list(range(module.PER_DEVICE_BATCH))  # TRL's pool, reused
    resets = [r for result in first for r in result["resets"]]
    seeds = [r["seed"] for r in resets]
    assert len(set(seeds)) == len(seeds) == 2 * per_rank, seeds  # across instances, steps and ranks
    assert len({r["target"] for r in resets}) == len(resets)  # and so are the episodes: the secret numbers (1 to 10^6)
    # the documented formula: rank r's k-th seedless reset takes seed_start + r + world_size * k
    for result in first:
        assert [r["seed"] for r in result["resets"]] == [module.SEED_START + result["rank"] + 2 * k for k in range(per_rank)]
    assert [result["resets"] for result in second] == [result["resets"] for result in first]  # reproducible
    assert all(r["seed_attribute"] == r["seed"] for r in resets)  # the instance says which episode it plays
