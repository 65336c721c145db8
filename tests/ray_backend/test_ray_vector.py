"""RayVectorEnv on a local 2-CPU Ray cluster: the sync backend's trajectories for each autoreset mode,
a killed or late actor recovered, nothing left after close, bad input refused at once, the runner's pool."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from conftest import actor_states, alive, wait_until

import gem_core
from gem_core.errors import InvalidArgumentError, UnknownKwargError
from gem_core.ray.cluster import RayBackendError
from gem_core.rollout import RunConfig, run_episodes
from gem_core.rollout.policy import Generation
from gem_core.ray import RayVectorEnv
from gem_core.vector import AutoresetMode, VectorEnvError

from test_vector import MIXED_IDS, as_lists, drive, reference  # noqa: E402  (tests/core, on sys.path)
from vector_test_envs import COUNTER_ID  # noqa: E402

# Fractions of a CPU, so that several actors fit on the 2-CPU test cluster.
SMALL = {"num_cpus": 0.25}


def make(ids, num_envs=None, **vector_kwargs):
    return gem_core.make_vec(ids, num_envs, vectorization_mode="ray", vector_kwargs={**SMALL, **vector_kwargs})


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_same_seeds_give_the_sync_backends_trajectories(ray_cluster, mode):
    """Seven mixed envs, three per actor (uneven shards): exactly what the sync backend and plain envs give."""
    expected = reference(MIXED_IDS, mode, steps=25, seed=100, action_seed=7)
    with gem_core.make_vec(MIXED_IDS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}) as sync_vec:
        assert drive(sync_vec, MIXED_IDS, 25, seed=100, action_seed=7) == expected
    with make(MIXED_IDS, autoreset_mode=mode.name, envs_per_actor=3) as vec:
        assert vec.shards == [[0, 1, 2], [3, 4], [5, 6]]  # at most 3 per actor, balanced
        assert drive(vec, MIXED_IDS, 25, seed=100, action_seed=7) == expected


def test_call_get_attr_and_default_packing(ray_cluster):
    with make(COUNTER_ID, 6) as vec:  # 2 CPUs / 0.25 per actor: 8 slots, so one env per actor
        assert len(vec.actors) == 6 and vec.envs_per_actor == 1
        vec.reset(seed=1)
        assert vec.get_attr("max_steps") == [6] * 6
        assert [a[0] for a in vec.call("sample_random_action")] == ["+"] * 6
    with make(COUNTER_ID, 6, num_cpus=1) as vec:  # 2 slots: three envs per actor
        assert vec.shards == [[0, 1, 2], [3, 4, 5]]


def killed_run(seed: int):
    """Four counters on two actors; actor 1 is killed with ray.kill between steps, mid-episode."""
    import ray

    vec = make(COUNTER_ID, 4, envs_per_actor=2)
    try:
        record = [vec.reset(seed=seed), as_lists(vec.step(["+1"] * 4))]
        killed = vec.actors[1]
        ray.kill(killed)
        # ray.kill only asks: on a loaded machine the next step could still reach the actor
        assert wait_until(lambda: actor_states().get(killed._actor_id.hex()) == "DEAD")
        record.append(as_lists(vec.step(["+1"] * 4)))
        assert vec.actors[1] is not killed
        for _ in range(3):
            record.append(as_lists(vec.step(["+1"] * 4)))
    except BaseException:
        vec.close()  # a failure here must not leave actors holding the cluster's CPUs for later tests
        raise
    return record, vec


def test_a_killed_actor_is_replaced_and_its_episodes_truncated(ray_cluster):
    record, vec = killed_run(seed=5)
    vec.close()
    with gem_core.make_vec(COUNTER_ID, 4) as sync_vec:
        expected = [sync_vec.reset(seed=5)] + [as_lists(sync_vec.step(["+1"] * 4)) for _ in range(2)]
    assert record[:2] == expected[:2]
    obs, rewards, terminated, truncated, infos = record[2]
    for i in (0, 1):  # the other actor's envs: exactly the sync run
        assert [column[i] for column in record[2]] == [column[i] for column in expected[2]]
    for i in (2, 3):
        assert truncated[i] and not terminated[i] and rewards[i] == 0.0
        reason = "env actor 1 died (The actor is dead because it was killed by `ray.kill`)"
        assert infos[i] == {"error": reason, "worker_restarted": True, "infra_error": reason}
        assert obs[i] == expected[1][0][i]  # its last observation
    obs, _, _, truncated, infos = record[3]
    for i in (2, 3):  # fresh envs: a new episode on the next step
        assert infos[i]["autoreset"] is True and obs[i].startswith("count=0") and not truncated[i]
    assert all(not info.get("error") for row in record[3:] for info in row[4])
    again, vec = killed_run(seed=5)  # the recovery is deterministic
    vec.close()
    assert again == record


def test_an_actor_killed_during_a_step_and_one_lost_while_idle(ray_cluster):
    import ray

    with make(COUNTER_ID, 4, envs_per_actor=2) as vec:
        vec.reset(seed=9)
        old = vec.actors[0]
        # an env that exits its process in the middle of a step
        obs, _, _, truncated, infos = vec.step(["exit 3", "+1", "+1", "+1"])
        assert truncated.tolist() == [True, True, False, False] and infos[1]["worker_restarted"] is True
        assert infos[0]["error"].startswith("env actor 0 died (")
        assert vec.actors[0] is not old
        # killed while none of its envs is being stepped: reported on their next step
        ray.kill(vec.actors[1])
        time.sleep(0.5)
        obs, _, _, truncated, infos = vec.step({0: "+1"})
        assert not truncated[0]
        obs, _, _, truncated, infos = vec.step({2: "+1", 3: "+1"})
        assert truncated.tolist() == [True, True] and "killed by `ray.kill`" in infos[0]["error"]
        obs, _, _, truncated, infos = vec.step(["+1"] * 4)
        assert not truncated.any() and infos[2]["autoreset"] and infos[3]["autoreset"]


def test_step_timeout_replaces_only_the_slow_actor(ray_cluster):
    with make(COUNTER_ID, 4, envs_per_actor=2, step_timeout=1.0) as vec:
        vec.reset(seed=6)
        started = time.monotonic()
        obs, _, _, truncated, infos = vec.step(["+1", "+1", "+1", "sleep 120"])
        assert 1.0 <= time.monotonic() - started < 30  # at the timeout, not the slow env's 120 s; room for load
        assert truncated.tolist() == [False, False, True, True]
        assert infos[3]["error"] == "step timed out after 1.0s (env actor 1 was killed)"
        obs, _, _, truncated, infos = vec.step(["+1"] * 4)  # the new actor's start-up is not held against it
        assert infos[3]["autoreset"] is True and not truncated.any()


def test_close_leaves_no_actors_and_no_processes(ray_cluster):
    before = {a for a, state in actor_states().items() if state != "DEAD"}
    vec = make(COUNTER_ID, 4, envs_per_actor=2)
    vec.reset(seed=0)
    pids = list(vec.actor_pids)
    assert alive(pids) == pids
    ours = {a for a, state in actor_states().items() if state != "DEAD"} - before
    assert len(ours) == 2
    vec.close()
    vec.close()  # idempotent
    assert wait_until(lambda: all(actor_states()[a] == "DEAD" for a in ours))
    assert wait_until(lambda: alive(pids) == [])
    with pytest.raises(RuntimeError, match="closed"):
        vec.step(["+1"] * 4)
    assert {a for a, state in actor_states().items() if state != "DEAD"} == before
    assert ray_cluster.is_initialized()  # a cluster it joined is not shut down


def test_an_env_that_cannot_be_built_raises_with_its_traceback(ray_cluster):
    with pytest.raises(VectorEnvError, match=r"env actor 0 could not build its envs:(.|\n)*ValueError: no"):
        RayVectorEnv([_broken_env], **SMALL)


def _broken_env():
    raise ValueError("no")


@pytest.mark.parametrize(
    ("vector_kwargs", "error", "message"),
    [
        ({"num_cpus": 0}, InvalidArgumentError, "num_cpus=0 is not allowed: expected a number > 0"),
        ({"num_cpus": -1}, InvalidArgumentError, "num_cpus=-1 is not allowed"),
        ({"envs_per_actor": 0}, InvalidArgumentError, "envs_per_actor=0 is not allowed: expected an integer >= 1"),
        ({"num_workers": 2}, UnknownKwargError, "vector_kwargs has 'num_workers', which RayVectorEnv does not take"),
        ({"resources": {"node_a": -1}}, InvalidArgumentError, "resources="),
        ({"resources": {"CPU": 1}}, InvalidArgumentError, "(CPUs: num_cpus)"),
        ({"scheduling_strategy": "PACK"}, InvalidArgumentError, "scheduling_strategy='PACK' is not allowed"),
        ({"step_timeout": 0}, InvalidArgumentError, "step_timeout=0 is not allowed"),
    ],
)
def test_bad_arguments_are_one_clear_error_before_any_actor(ray_cluster, vector_kwargs, error, message):
    before = len(actor_states())
    with pytest.raises(error) as caught:
        gem_core.make_vec(COUNTER_ID, 2, vectorization_mode="ray", vector_kwargs=vector_kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("make_vec(vectorization_mode='ray'): ")
    assert len(actor_states()) == before


def test_actors_the_cluster_cannot_place_fail_within_init_timeout(ray_cluster):
    started = time.monotonic()
    with pytest.raises(RayBackendError, match=r"2 of 2 env actors could not be placed within 2s \(each asks for CPU: 0.25, gpu_box: 1\)"):
        make(COUNTER_ID, 2, envs_per_actor=1, resources={"gpu_box": 1}, init_timeout=2)
    assert time.monotonic() - started < 30  # a hang guard with room for load
    assert wait_until(lambda: "PENDING_CREATION" not in actor_states().values() and "ALIVE" not in actor_states().values())


def test_a_placement_group_takes_the_actors(ray_cluster):
    """A placement group holding every CPU of the cluster: actors given it are placed in its bundles;
    without it the same actors cannot be placed at all."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray_cluster.get(group.ready(), timeout=60)
    try:
        with pytest.raises(RayBackendError, match="could not be placed"):
            make(COUNTER_ID, 2, envs_per_actor=1, init_timeout=2)
        with make(COUNTER_ID, 4, envs_per_actor=2, placement_group=group) as vec:
            observations, _ = vec.reset(seed=0)
            assert len(vec.actors) == 2 and len(observations) == 4
    finally:
        remove_placement_group(group)


def test_an_unreachable_address_is_one_line_at_once(tmp_path):
    """In a fresh process (not connected to Ray): a closed port is refused within seconds, never a hang."""
    script = (
        "import gem_core, sys\n"
        "try:\n"
        "    gem_core.make_vec('game:GuessTheNumber-v0', 2, vectorization_mode='ray', vector_kwargs={'address': '127.0.0.1:9'})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc); sys.exit(3)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip().splitlines() == [
        "RayBackendError no Ray cluster answers at '127.0.0.1:9' (Connection refused); start one with `ray start --head` or pass its head's address"
    ]
    assert time.monotonic() - started < 30


class CountingChat:
    """A text policy that always adds one."""

    async def chat(self, messages, params, *, request_id=""):
        return Generation([], None, "stop", text="+1")


def test_the_runner_plays_episodes_on_a_ray_pool(ray_cluster):
    """The runner's env pool on Ray: the same trajectories as on a sync pool."""

    def play(mode):
        with gem_core.make_vec(COUNTER_ID, 3, vectorization_mode=mode, vector_kwargs=SMALL if mode == "ray" else {}) as vec:
            trajectories = asyncio.run(run_episodes(vec, CountingChat(), config=RunConfig(max_turns=10), seeds=[1, 2, 3, 4, 5]))
        return [([t.observation for t in tr.turns], [t.reward for t in tr.turns], tr.terminated) for tr in trajectories]

    on_ray = play("ray")
    assert on_ray == play("sync") and len(on_ray) == 5 and all(len(observations) >= 3 for observations, *_ in on_ray)


def test_gem_core_play_runs_its_batch_on_ray(ray_cluster, capsys):
    """``gem-core play --vector ray`` plays the same episodes as ``--vector sync`` (seeded random policy)."""
    from gem_core import cli

    def summary(vector):
        capsys.readouterr()
        code = cli.main(["play", "game:GuessTheNumber-v0-easy", "--policy", "random", "--num-envs", "2", "--episodes", "6", "--vector", vector])
        lines = [line.split() for line in capsys.readouterr().out.splitlines()]
        assert code == 0
        return {" ".join(line[:-1]): line[-1] for line in lines if line and line[0] in ("episodes", "mean", "success")}

    on_ray = summary("ray")
    assert on_ray == summary("sync") and on_ray["episodes"] == "6" and {"mean return", "success rate"} <= set(on_ray)
