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
def two_nodes():
    """Two raylets on this host (the head with {"node_a": 1}, the other with {"node_b": 1}, one CPU each);
    ``ray stop`` at the end, even on failure. Yields the head's address and the environment to reach it."""
    head_port, *ports = free_ports(11)
    # Ray 2.5x+ turns token authentication on for `ray start --head` only where a token is set up;
    # these raylets and the driver share one host and one user: no token, for all three alike.
    env = {**os.environ, **RUNTIME_ENV["env_vars"], "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    head = [
        RAY,
        "start",
        "--head",
        f"--port={head_port}",
        "--include-dashboard=false",
        *common,
        "--resources=" + json.dumps({"node_a": 1}),
        *node_ports(ports[:5]),
        "--min-worker-port=20000",
        "--max-worker-port=20999",
    ]
    address = f"127.0.0.1:{head_port}"
    worker = [
        RAY,
        "start",
        f"--address={address}",
        *common,
        "--resources=" + json.dumps({"node_b": 1}),
        *node_ports(ports[5:10]),
        "--min-worker-port=21000",
        "--max-worker-port=21999",
    ]
    try:
        for command in (head, worker):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"
        yield address, env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_envs_and_sandbox_actors_run_on_both_nodes(two_nodes):
    address, env = two_nodes
    driver = [sys.executable, str(Path(__file__).with_name("two_node_driver.py")), address]
    done = subprocess.run(driver, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    nodes = report["nodes"]
    assert sorted(nodes.values()) == [["node_a"], ["node_b"]]
    by_name = {names[0]: node_id for node_id, names in nodes.items()}
    assert [o.split()[0] for o in report["stepped"]] == ["count=1"] * 4
    assert sorted(set(report["spread"])) == sorted(nodes)  # SPREAD: env actors on both nodes
    assert set(report["pinned_to_b"]) == {by_name["node_b"]}  # a custom resource pins them
    assert report["sandbox"] == {node: node for node in nodes}  # a sandbox actor on each node, running there
