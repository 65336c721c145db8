"""The sandbox and search services on a local 2-CPU Ray cluster: code envs in env actors graded by the
node's sandbox actor, PythonSandbox routed by install(), a search server every env reaches, and each
service stopped by whoever started it (nothing left behind)."""

from __future__ import annotations

import json

import pytest
from conftest import actor_states, alive, wait_until
from sandbox_support import require_bwrap

import gem_core
from gem_core.ray.services import SandboxService, SearchService
from gem_core.tools.sandbox import PythonSandbox
from gem_core.tools.sandbox.pool import route_shared_pools

SMALL = {"num_cpus": 0.25}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    pytest.importorskip("datasets", reason="code envs need the tasks extra")
    require_bwrap()
    from gem_core.envs.code_data import code_rows

    path = tmp_path_factory.mktemp("code") / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in code_rows()))
    return str(path)


def solve(observation: str) -> str:
    from gem_core.envs.code_data import PROBLEMS

    solution = next(p["solution"] for p in PROBLEMS if p["problem"] in observation)
    return f"```python\n{solution}\n```"


def live(actor_ids):
    return [a for a in actor_ids if actor_states().get(a) != "DEAD"]


def test_code_envs_in_actors_run_their_code_on_the_sandbox_service(ray_cluster, problems):
    service = SandboxService.start(workers_per_node=2)
    try:
        kwargs = {**SMALL, "envs_per_actor": 2, "sandbox": service}
        with gem_core.make_vec("code:CodeContest", 4, vectorization_mode="ray", vector_kwargs=kwargs, data_files=problems) as vec:
            obs, _ = vec.reset(seed=0)
            _, rewards, terminated, _, infos = vec.step([solve(o) for o in obs])
            assert rewards.tolist() == [1.0] * 4 and terminated.all(), infos
        (stats,) = service.stats().values()
        assert stats["workers"] >= 1 and stats["replaced"] == 0  # the code ran in the service's pool
        pids = stats["worker_pids"]
    finally:
        service.stop()
    assert wait_until(lambda: alive(pids) == [])  # its bubblewrap workers went with it


def test_sandbox_true_starts_and_stops_a_service_with_the_envs(ray_cluster, problems):
    before = set(actor_states())
    kwargs = {**SMALL, "envs_per_actor": 2, "sandbox": True}
    with gem_core.make_vec("code:CodeContest", 2, vectorization_mode="ray", vector_kwargs=kwargs, data_files=problems) as vec:
        obs, _ = vec.reset(seed=3)
        assert vec.step([solve(o) for o in obs])[1].tolist() == [1.0, 1.0]
        assert len(vec.sandbox.node_ids) == 1
    assert wait_until(lambda: live(set(actor_states()) - before) == [])  # env actors and the sandbox actor


def test_python_sandbox_in_any_process_after_install(ray_cluster):
    require_bwrap()
    service = SandboxService.start(workers_per_node=1, name="tests")
    try:
        found = SandboxService.connect("tests")
        assert found.node_ids == service.node_ids
        found.install()
        with PythonSandbox(timeout=5) as sandbox:
            result = sandbox.run("print(6 * 7)")
        assert result.ok and result.stdout == "42\n"
        assert sum(s["workers"] for s in service.stats().values()) == 1
    finally:
        route_shared_pools(None)
        service.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    pytest.importorskip("bm25s", reason="the search server needs the search extra")
    path = tmp_path_factory.mktemp("search") / "corpus.jsonl"
    docs = [
        {"id": "1", "title": "Paris", "text": "Paris is the capital of France."},
        {"id": "2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
        {"id": "3", "title": "Rust", "text": "Rust is a systems programming language."},
    ]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def with_search(env):
    from gem_core.tools.factory import make_tool
    from gem_core.wrappers import ToolEnvWrapper

    return ToolEnvWrapper(env, [make_tool("search")])  # reads GEM_SEARCH_URL, in the actor


@pytest.mark.parametrize("how", ["service", "corpus path", "url"])
def test_every_env_actor_reaches_one_search_server(ray_cluster, corpus, how):
    before = set(actor_states())
    service = SearchService.start(corpus) if how != "corpus path" else None
    search = {"service": service, "corpus path": corpus, "url": service.url if service else None}[how]
    try:
        kwargs = {**SMALL, "envs_per_actor": 1, "search": search}
        with gem_core.make_vec("test:VectorCounter-v0", 2, vectorization_mode="ray", vector_kwargs=kwargs, wrappers=[with_search]) as vec:
            vec.reset(seed=0)
            obs, _, _, _, infos = vec.step(["<search>capital of Germany</search>"] * 2)
            assert all("Berlin is the capital of Germany." in o for o in obs), obs
    finally:
        if service is not None:
            service.stop()
    assert wait_until(lambda: live(set(actor_states()) - before) == [])
