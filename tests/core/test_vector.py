"""Vector envs: sync/async equivalence, autoreset modes, subsets, masks, crash and timeout recovery."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gem_core
from gem_core.errors import ResetNeeded
from gem_core.vector import AsyncVectorEnv, AutoresetMode, VectorEnvError

# Spawned workers import the test envs by module name: they inherit sys.path from this process.
sys.path.insert(0, str(Path(__file__).parent))
import vector_test_envs  # noqa: E402  (needs the sys.path entry above)
from vector_test_envs import COUNTER_ID, CounterEnv  # noqa: E402

vector_test_envs.register_test_envs()

GUESS_ID = "game:GuessTheNumber-v0-hard"
MIXED_IDS = [GUESS_ID, COUNTER_ID, GUESS_ID, COUNTER_ID, COUNTER_ID, GUESS_ID, COUNTER_ID]


def make(mode: str, ids: list[str] | str, num_envs: int | None = None, **vector_kwargs):
    return gem_core.make_vec(ids, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs)


def random_actions(rng: np.random.Generator, ids: list[str]) -> list[str]:
    """One action per env: guesses (sometimes unboxed, a format error) or counter increments."""
    actions = []
    for env_id in ids:
        if env_id == GUESS_ID:
            guess = int(rng.integers(1, 51))
            actions.append(f"\\boxed{{{guess}}}" if rng.random() > 0.1 else f"my guess is {guess}")
        else:
            actions.append(f"+{int(rng.integers(1, 4))}")
    return actions


def as_lists(step_result) -> tuple:
    obs, rewards, terminated, truncated, infos = step_result
    return list(obs), rewards.tolist(), terminated.tolist(), truncated.tolist(), list(infos)


def drive(vec, ids: list[str], steps: int, seed: int, action_seed: int) -> list:
    """Reset, then step with seeded random actions; under DISABLED step only live envs and reset the
    ended ones with a mask. Returns everything the vector env returned."""
    rng = np.random.default_rng(action_seed)
    record = [vec.reset(seed=seed)]
    live = [True] * len(ids)
    for _ in range(steps):
        actions = random_actions(rng, ids)
        if vec.autoreset_mode is AutoresetMode.DISABLED:
            result = vec.step({i: a for i, a in enumerate(actions) if live[i]})
            stepped = [i for i in range(len(ids)) if live[i]]
            for k, i in enumerate(stepped):
                live[i] = not (result[2][k] or result[3][k])
            record.append(as_lists(result))
            if not all(live):
                record.append(vec.reset(options={"reset_mask": [not x for x in live]}))
                live = [True] * len(ids)
        else:
            record.append(as_lists(vec.step(actions)))
    return record


def reference(ids: list[str], mode: AutoresetMode, steps: int, seed: int, action_seed: int) -> list:
    """The same run with plain single envs and the autoreset rules written out by hand."""
    rng = np.random.default_rng(action_seed)
    envs = [gem_core.make(env_id) for env_id in ids]
    first = [env.reset(seed=seed + i) for i, env in enumerate(envs)]
    record = [([o for o, _ in first], [info for _, info in first])]
    ended = [False] * len(ids)
    for _ in range(steps):
        actions = random_actions(rng, ids)
        rows = []
        for i, (env, action) in enumerate(zip(envs, actions)):
            if ended[i] and mode is AutoresetMode.DISABLED:
                continue
            if ended[i]:
                obs, info = env.reset()
                rows.append((obs, 0.0, False, False, {**info, "autoreset": True}))
                ended[i] = False
                continue
            obs, reward, terminated, truncated, info = env.step(action)
            if (terminated or truncated) and mode is AutoresetMode.SAME_STEP:
                new_obs, new_info = env.reset()
                info = {**new_info, "final_obs": obs, "final_info": info}
                obs = new_obs
            else:
                ended[i] = terminated or truncated
            rows.append((obs, reward, terminated, truncated, info))
        record.append(tuple(list(column) for column in zip(*rows)))
        if mode is AutoresetMode.DISABLED and any(ended):
            resets = [env.reset() if ended[i] else (None, None) for i, env in enumerate(envs)]
            record.append(([o for o, _ in resets], [info for _, info in resets]))
            ended = [False] * len(ids)
    return record


def workers_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


# -- semantics, both implementations ---------------------------------------------------------------


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_sync_and_async_match_a_hand_written_reference(mode):
    """Same seeds, same actions: sync, async (3 workers, uneven shards) and plain envs agree exactly."""
    expected = reference(MIXED_IDS, mode, steps=25, seed=100, action_seed=7)
    endings = sum(sum(row[2]) + sum(row[3]) for row in expected[1:] if len(row) == 5)
    assert endings >= 10  # the run exercises the autoreset rules many times
    with make("sync", MIXED_IDS, autoreset_mode=mode) as sync_vec:
        assert drive(sync_vec, MIXED_IDS, 25, seed=100, action_seed=7) == expected
    with make("async", MIXED_IDS, autoreset_mode=mode.name, num_workers=3) as async_vec:
        assert async_vec.shards == [[0, 1, 2], [3, 4], [5, 6]]
        assert drive(async_vec, MIXED_IDS, 25, seed=100, action_seed=7) == expected


def test_autoreset_mode_accepts_enum_and_names():
    assert AutoresetMode.coerce("NEXT_STEP") is AutoresetMode.NEXT_STEP
    assert AutoresetMode.coerce("same_step") is AutoresetMode.SAME_STEP
    assert AutoresetMode.coerce("Disabled") is AutoresetMode.DISABLED
    assert AutoresetMode.coerce(AutoresetMode.SAME_STEP) is AutoresetMode.SAME_STEP
    assert make("sync", COUNTER_ID, 2, autoreset_mode="SameStep").autoreset_mode is AutoresetMode.SAME_STEP
    with pytest.raises(ValueError, match="NEXT_STEP"):
        AutoresetMode.coerce("sometimes")


def finish_episode(vec, index: int) -> int:
    """Step env ``index`` with "+3" until its episode ends; returns how many steps it took."""
    for steps in range(1, 20):
        _, _, terminated, truncated, _ = vec.step({index: "+3"})
        if terminated[0] or truncated[0]:
            return steps
    raise AssertionError("episode did not end")


def test_next_step_autoreset_ignores_the_action_and_uses_the_envs_own_stream():
    vec = make("sync", COUNTER_ID, 2)
    vec.reset(seed=3)
    steps = finish_episode(vec, 0)
    obs, rewards, terminated, truncated, infos = vec.step(["raise", "+1"])  # env 0's action is ignored
    twin = CounterEnv()
    twin.reset(seed=3)
    for _ in range(steps):
        twin.step("+3")
    expected_obs, expected_info = twin.reset()
    assert obs[0] == expected_obs and infos[0] == {**expected_info, "autoreset": True}
    assert (rewards[0], terminated[0], truncated[0]) == (0.0, False, False)
    assert rewards.dtype == np.float64 and terminated.dtype == bool and truncated.dtype == bool
    assert "autoreset" not in infos[1]


def test_same_step_autoreset_returns_the_reset_obs_and_the_final_one_in_info():
    vec = make("sync", COUNTER_ID, 1, autoreset_mode="SAME_STEP")
    vec.reset(seed=11)
    twin = CounterEnv()
    twin.reset(seed=11)
    while True:
        obs, rewards, terminated, truncated, infos = vec.step(["+3"])
        final_obs, reward, twin_terminated, twin_truncated, final_info = twin.step("+3")
        if twin_terminated or twin_truncated:
            break
        assert obs[0] == final_obs and "final_obs" not in infos[0]
    reset_obs, reset_info = twin.reset()
    assert (terminated[0], truncated[0], rewards[0]) == (twin_terminated, twin_truncated, reward)
    assert obs[0] == reset_obs
    assert infos[0] == {**reset_info, "final_obs": final_obs, "final_info": final_info}
    assert vec.step(["+1"])[0][0].startswith("count=1")  # the new episode runs at once


def test_disabled_mode_refuses_ended_envs_and_resets_with_a_mask():
    vec = make("sync", COUNTER_ID, 3, autoreset_mode=AutoresetMode.DISABLED)
    vec.reset(seed=0)
    vec.step(["+1", "+1", "+1"])
    finish_episode(vec, 1)
    with pytest.raises(ResetNeeded, match=r"env 1\b.*reset_mask"):
        vec.step(["+1", "+1", "+1"])
    obs, _, _, _, _ = vec.step({0: "+1", 2: "+1"})  # the others go on
    assert [o.split()[0] for o in obs] == ["count=2", "count=2"]
    obs, infos = vec.reset(seed=50, options={"reset_mask": [False, True, False]})
    assert obs[0] is None and obs[2] is None and infos[0] is None and infos[2] is None
    twin = CounterEnv()
    assert (obs[1], infos[1]) == twin.reset(seed=51)  # seed + index
    obs, *_ = vec.step(["+1", "+1", "+1"])
    assert [o.split()[0] for o in obs] == ["count=3", "count=1", "count=3"]


def test_subset_step_returns_values_in_key_order_and_leaves_others_alone():
    vec = make("sync", COUNTER_ID, 4)
    vec.reset(seed=20)
    obs, rewards, terminated, truncated, infos = vec.step({3: "+2", 1: "+1"})
    assert len(obs) == len(rewards) == len(terminated) == len(truncated) == len(infos) == 2
    assert [info["count"] for info in infos] == [2, 1]
    assert rewards.tolist() == pytest.approx([0.2, 0.1])
    obs, *_ = vec.step(["+0", "+0", "+0", "+0"])
    assert [o.split()[0] for o in obs] == ["count=0", "count=1", "count=0", "count=2"]
    assert vec.step({})[0] == []
    with pytest.raises(IndexError):
        vec.step({4: "+1"})
    with pytest.raises(TypeError):
        vec.step({"0": "+1"})


def test_reset_seeds_masks_and_bad_arguments():
    vec = make("sync", COUNTER_ID, 3)
    with pytest.raises(ResetNeeded, match="reset"):
        vec.step(["+1"] * 3)
    obs, infos = vec.reset(seed=[7, None, 9])
    assert obs[0] == CounterEnv().reset(seed=7)[0] and obs[2] == CounterEnv().reset(seed=9)[0]
    obs, _ = vec.reset(seed=7)
    assert obs == [CounterEnv().reset(seed=7 + i)[0] for i in range(3)]
    vec.step(["+1"] * 3)
    obs, infos = vec.reset(options={"reset_mask": np.array([True, False, False])})
    assert obs[0].startswith("count=0") and obs[1:] == [None, None] and infos[1:] == [None, None]
    obs, *_ = vec.step(["+1"] * 3)
    assert [o.split()[0] for o in obs] == ["count=1", "count=2", "count=2"]
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": [True, False]})
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": [1, 0, 1]})
    with pytest.raises(ValueError, match="3 envs"):
        vec.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="3 envs"):
        vec.step(["+1"])
    with pytest.raises(TypeError, match="single str"):
        vec.step("+1")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_call_and_get_attr(mode):
    with make(mode, COUNTER_ID, 3, **({"num_workers": 2} if mode == "async" else {})) as vec:
        _, infos = vec.reset(seed=4)
        assert vec.get_attr("target") == [info["target"] for info in infos]
        states = vec.call("get_state")
        assert [state["target"] for state in states] == [info["target"] for info in infos]
        assert vec.call("max_steps") == [6, 6, 6]  # a plain attribute comes back as is
        with pytest.raises(VectorEnvError, match="AttributeError"):
            vec.call("no_such_method")
        with pytest.raises(ValueError, match="bookkeeping"):
            vec.call("step", "+1")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_error_raise_reports_env_and_traceback_then_continues(mode):
    with make(mode, COUNTER_ID, 3) as vec:
        vec.reset(seed=1)
        with pytest.raises(VectorEnvError, match="counter exploded") as err:
            vec.step(["+1", "raise", "+1"])
        assert err.value.env_index == 1
        assert "Traceback" in err.value.remote_traceback and "vector_test_envs.py" in err.value.remote_traceback
        obs, *_, infos = vec.step(["+1", "+1", "+1"])
        assert infos[1].get("autoreset") is True and obs[1].startswith("count=0")
        assert [o.split()[0] for o in (obs[0], obs[2])] == ["count=2", "count=2"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_error_truncate_reports_a_truncated_episode(mode):
    with make(mode, COUNTER_ID, 3, on_error="truncate") as vec:
        obs0, _ = vec.reset(seed=1)
        pids = vec.worker_pids if mode == "async" else None
        obs, rewards, terminated, truncated, infos = vec.step(["+1", "raise", "+1"])
        assert truncated.tolist() == [False, True, False] and not terminated[1] and rewards[1] == 0.0
        assert "RuntimeError: counter exploded" in infos[1]["error"] and infos[1]["worker_restarted"] is False
        assert infos[1]["infra_error"] == infos[1]["error"]  # the env's own code failed, not the policy
        assert "Traceback" in infos[1]["traceback"]
        assert obs[1] == obs0[1]  # the last observation that env gave
        if mode == "async":
            assert vec.worker_pids == pids  # no restart for an exception
        obs, *_ = vec.step(["+1", "+1", "+1"])
        assert obs[1].startswith("count=0") and obs[0].startswith("count=2")


def test_sync_rejects_step_timeout_and_async_validates_arguments():
    with pytest.raises(ValueError, match="cannot enforce step_timeout"):
        make("sync", COUNTER_ID, 2, step_timeout=1.0)
    with pytest.raises(ValueError, match="on_error"):
        make("sync", COUNTER_ID, 2, on_error="ignore")
    with pytest.raises(ValueError, match="num_workers"):
        AsyncVectorEnv([CounterEnv], num_workers=0)
    with pytest.raises(TypeError, match="picklable"):
        AsyncVectorEnv([lambda: CounterEnv()])


# -- async: crashes, timeouts, cleanup --------------------------------------------------------------


def crash_run(seed: int):
    """Four counters on two workers; worker 1 is SIGKILLed between steps. Returns (record, vec)."""
    vec = make("async", COUNTER_ID, 4, num_workers=2)
    record = [vec.reset(seed=seed)]
    record.append(as_lists(vec.step(["+1"] * 4)))
    old_pids = vec.worker_pids
    os.kill(old_pids[1], signal.SIGKILL)
    record.append(as_lists(vec.step(["+1"] * 4)))
    assert vec.worker_pids[0] == old_pids[0] and vec.worker_pids[1] != old_pids[1]
    for _ in range(4):
        record.append(as_lists(vec.step(["+1"] * 4)))
    return record, vec


def test_killed_worker_is_restarted_and_other_transitions_are_intact():
    record, vec = crash_run(seed=5)
    vec.close()
    with make("sync", COUNTER_ID, 4) as sync_vec:
        expected = [sync_vec.reset(seed=5)] + [as_lists(sync_vec.step(["+1"] * 4)) for _ in range(2)]
    assert record[0] == expected[0] and record[1] == expected[1]
    obs, rewards, terminated, truncated, infos = record[2]
    for i in (0, 1):  # worker 0's envs: exactly what the sync run gave
        assert [column[i] for column in record[2]] == [column[i] for column in expected[2]]
    for i in (2, 3):
        assert truncated[i] and not terminated[i] and rewards[i] == 0.0
        assert infos[i] == {"error": "worker 1 died (exit code -9)", "worker_restarted": True, "infra_error": "worker 1 died (exit code -9)"}
        assert obs[i] == expected[1][0][i]  # its last observation
    obs, rewards, terminated, truncated, infos = record[3]
    for i in (2, 3):  # the rebuilt envs start new episodes on their next step
        assert infos[i]["autoreset"] is True and obs[i].startswith("count=0") and not truncated[i]
    assert all(not info.get("error") for row in record[3:] for info in row[4])
    # and the recovery is deterministic: the same crash point replays identically
    again, vec = crash_run(seed=5)
    vec.close()
    assert again == record


def test_envs_lost_while_not_stepped_are_reported_on_their_next_step():
    with make("async", COUNTER_ID, 4, num_workers=2) as vec:
        vec.reset(seed=9)
        os.kill(vec.worker_pids[1], signal.SIGKILL)
        obs, _, _, truncated, infos = vec.step({0: "+1"})  # worker 1 is not involved
        assert not truncated[0] and obs[0].startswith("count=1")
        obs, _, _, truncated, infos = vec.step({2: "+1"})
        assert truncated[0] and infos[0]["error"] == "worker 1 died (exit code -9)"
        obs, _, _, truncated, infos = vec.step({3: "+1", 1: "+1"})
        assert truncated.tolist() == [True, False]
        assert "worker 1 died (exit code -9)" in infos[0]["error"] and infos[0]["worker_restarted"] is True
        obs, _, _, truncated, infos = vec.step({3: "+1"})
        assert infos[0]["autoreset"] is True and not truncated[0]


def test_os_exit_inside_step_is_a_worker_death():
    with make("async", COUNTER_ID, 4, num_workers=2) as vec:
        vec.reset(seed=2)
        obs, _, _, truncated, infos = vec.step(["exit 3", "+1", "+1", "+1"])
        assert truncated.tolist() == [True, True, False, False]
        assert infos[0]["error"] == "worker 0 died (exit code 3)" and infos[1]["worker_restarted"] is True
        assert infos[0]["infra_error"] == "worker 0 died (exit code 3)"
        assert [o.split()[0] for o in obs[2:]] == ["count=1", "count=1"]
        obs, _, _, truncated, infos = vec.step(["+1"] * 4)
        assert infos[0]["autoreset"] and infos[1]["autoreset"] and not truncated.any()


def test_step_timeout_kills_only_the_slow_worker_and_returns_on_time():
    timeout = 1.0
    with make("async", COUNTER_ID, 4, num_workers=2, step_timeout=timeout) as vec:
        vec.reset(seed=6)
        old_pids = vec.worker_pids
        started = time.monotonic()
        obs, _, _, truncated, infos = vec.step(["+1", "+1", "+1", "sleep 120"])
        elapsed = time.monotonic() - started
        # at the timeout, not when the slow env would answer (120 s); the room is for a loaded machine's restart
        assert timeout <= elapsed < 30
        assert truncated.tolist() == [False, False, True, True]
        assert "step timed out after 1.0s" in infos[3]["error"] and infos[2]["worker_restarted"] is True
        assert [o.split()[0] for o in obs[:2]] == ["count=1", "count=1"]
        assert vec.worker_pids[0] == old_pids[0] and vec.worker_pids[1] != old_pids[1]
        assert old_pids[1] not in workers_alive([old_pids[1]])
        # The restarted worker's start-up does not count against the limit, and the run goes on.
        obs, _, _, truncated, infos = vec.step(["+1"] * 4)
        assert infos[3]["autoreset"] is True and not truncated.any()
        obs, *_ = vec.step(["+1"] * 4)
        assert obs[3].startswith("count=1")


def test_reset_that_kills_its_worker_raises_instead_of_hanging():
    with make("async", COUNTER_ID, 2, num_workers=2) as vec:
        with pytest.raises(VectorEnvError, match=r"reset failed twice.*died \(exit code 5\)"):
            vec.reset(seed=0, options={"exit": 5})
        obs, _ = vec.reset(seed=0)  # the workers were restarted: it works again
        assert obs == [CounterEnv().reset(seed=i)[0] for i in range(2)]


def test_close_leaves_no_worker_processes():
    vec = make("async", COUNTER_ID, 4, num_workers=2)
    vec.reset(seed=0)
    pids = vec.worker_pids
    assert workers_alive(pids) == pids
    vec.close()
    vec.close()  # idempotent
    assert workers_alive(pids) == []
    assert not {p.pid for p in multiprocessing.active_children()} & set(pids)
    with pytest.raises(RuntimeError, match="closed"):
        vec.step(["+1"] * 4)
    with make("async", COUNTER_ID, 2) as vec:
        pids = vec.worker_pids
    assert vec.closed and workers_alive(pids) == []
    vec = make("async", COUNTER_ID, 2)
    pids = vec.worker_pids
    del vec
    gc.collect()
    assert workers_alive(pids) == []


def test_interrupted_step_does_not_leave_a_stale_reply_behind():
    """A Ctrl-C (here: an exception from a timer signal) in the middle of a step must not let the
    late reply of that step be read as the answer to the next request."""

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with make("async", COUNTER_ID, 4, num_workers=2) as vec:
            vec.reset(seed=3)
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                vec.step(["+1", "+1", "+1", "sleep 1"])
            _, _, _, truncated, infos = vec.step(["+1"] * 4)
            assert truncated[2] and truncated[3] and "interrupted step" in infos[3]["error"]
            assert vec.get_attr("count")[2:] == [0, 0]  # worker 1 was rebuilt; its replies are gone
            _, _, _, truncated, infos = vec.step(["+1"] * 4)
            assert infos[3]["autoreset"] is True and not truncated.any()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_script_that_never_closes_its_vector_env_still_exits_cleanly(tmp_path):
    script = tmp_path / "forgetful.py"
    script.write_text(
        "import gem_core\n"
        "if __name__ == '__main__':\n"
        "    vec = gem_core.make_vec('game:GuessTheNumber-v0-hard', 2, vectorization_mode='async')\n"
        "    vec.reset(seed=0)\n"
        "    print(*vec.worker_pids)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2 and workers_alive(pids) == []
