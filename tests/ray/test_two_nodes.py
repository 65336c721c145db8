"""A two-node Ray cluster made of two local raylets (`ray start --head` plus `ray start --address`, each
with its own ports and one CPU, told apart by a custom resource): env actors and sandbox actors run on both."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RUNTIME_ENV

import gem_core
from gem_core.ray.services import SandboxService

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def node_ports(ports: list[int]) -> list[str]:
    """The per-raylet ports Ray needs distinct when two raylets share a host."""
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port", "--metrics-export-port", "--runtime-env-agent-port"]
    return [f"{name}={port}" for name, port in zip(names, ports)]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    import ray
    import vector_test_envs

    vector_test_envs.register_test_envs()
    assert not ray.is_initialized()
    head_port, *ports = free_ports(11)
    # Ray 2.5x+ turns token authentication on for `ray start --head` only where a token is set up;
    # these raylets and this driver share one host and one user: no token, for all three alike.
    auth = {"RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, **RUNTIME_ENV["env_vars"], "RAY_ADDRESS": ""}
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    head = [RAY, "start", "--head", f"--port={head_port}", "--include-dashboard=false", *common,
            "--resources=" + json.dumps({"node_a": 1}), *node_ports(ports[:5]), "--min-worker-port=20000", "--max-worker-port=20999"]
    address = f"127.0.0.1:{head_port}"
    worker = [RAY, "start", f"--address={address}", *common, "--resources=" + json.dumps({"node_b": 1}),
              *node_ports(ports[5:10]), "--min-worker-port=21000", "--max-worker-port=21999"]
    try:
        for command in (head, worker):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"
        ray.init(address=address, namespace="gem-two-nodes", runtime_env=RUNTIME_ENV)
        yield ray
    finally:
        ray.shutdown()
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_envs_and_sandbox_actors_run_on_both_nodes(two_nodes):
    ray = two_nodes
    nodes = {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}
    assert len(nodes) == 2
    by_name = {("node_a" if "node_a" in r else "node_b"): node_id for node_id, r in nodes.items()}
    with gem_core.make_vec("test:VectorCounter-v0", 4, vectorization_mode="ray", vector_kwargs={"num_cpus": 0.5, "envs_per_actor": 1}) as vec:
        assert sorted(set(vec.actor_nodes)) == sorted(nodes)  # SPREAD: both nodes
        vec.reset(seed=0)
        vec.step(["+1"] * 4)
    # pinned by custom resource: every actor of this one on node_b
    with gem_core.make_vec("test:VectorCounter-v0", 2, vectorization_mode="ray", vector_kwargs={"num_cpus": 0.25, "resources": {"node_b": 0.1}}) as vec:
        assert set(vec.actor_nodes) == {by_name["node_b"]}
    service = SandboxService.start(workers_per_node=1)
    try:
        assert set(service.node_ids) == set(nodes)
        where = {node: ray.get(actor.where.remote())[0] for node, actor in service.actors.items()}
        assert all(node == ran_on for node, ran_on in where.items())
    finally:
        service.stop()
