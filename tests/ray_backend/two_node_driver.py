"""The driver of test_two_nodes.py, run in a fresh process: connect to the cluster at argv[1], place env
actors and sandbox actors, print where they ran as JSON. A fresh process: in the same pytest process, after
the other modules' local clusters were started and shut down, Ray 2.60 reported the env actors made on this
cluster as dead before they ran ("all references to the actor were removed"); a fresh driver does not."""

from __future__ import annotations

import json
import sys

import ray
import vector_test_envs

import gem_core
from gem_core.ray.services import SandboxService


def main(address: str) -> None:
    vector_test_envs.register_test_envs()
    ray.init(address=address, namespace="gem-two-nodes")
    nodes = {node["NodeID"]: sorted(k for k in node["Resources"] if k.startswith("node_")) for node in ray.nodes() if node["Alive"]}
    report: dict = {"nodes": nodes}
    kwargs = {"num_cpus": 0.5, "envs_per_actor": 1}
    with gem_core.make_vec(vector_test_envs.COUNTER_ID, 4, vectorization_mode="ray", vector_kwargs=kwargs) as vec:
        vec.reset(seed=0)
        report["stepped"] = vec.step(["+1"] * 4)[0]
        report["spread"] = vec.actor_nodes
    kwargs = {"num_cpus": 0.25, "resources": {"node_b": 0.1}}
    with gem_core.make_vec(vector_test_envs.COUNTER_ID, 2, vectorization_mode="ray", vector_kwargs=kwargs) as vec:
        report["pinned_to_b"] = vec.actor_nodes
    service = SandboxService.start(workers_per_node=1)
    try:
        report["sandbox"] = {node: ray.get(actor.where.remote())[0] for node, actor in service.actors.items()}
    finally:
        service.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
