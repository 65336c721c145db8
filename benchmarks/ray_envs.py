"""The ray backend against sync and async: code-execution envs, and the ray backend's cost per step.

    python benchmarks/ray_envs.py                          # a local Ray cluster on this machine
    python benchmarks/ray_envs.py --address HEAD:6379      # a running multi-node cluster (run on a node of it)
    nox -s bench_ray

Throughput: ``--num-envs`` (32) ``code:CodeContest`` envs (gem_core's small local problem set; every
action is a problem's reference solution, run against its 3 tests in the bubblewrap sandbox: real
code, reward 1), SAME_STEP autoreset so every step is one graded answer, stepped ``--steps`` times on
each backend: ``sync`` (one process, its shared sandbox pool), ``async`` (one worker process per core),
``ray`` (one actor per CPU of the cluster, ``envs_per_actor`` envs each, each actor's own sandbox pool)
and ``ray + sandbox service`` (the same actors, the code run by the sandbox actor of each node).

Overhead: the same number of ``game:GuessTheNumber-v0`` envs (a step costs microseconds), ms per
batched step on each backend; the ray backend's overhead is its ms/step minus sync's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import gem_core
from gem_core.envs.code_data import PROBLEMS, code_rows

TRIVIAL_ID = "game:GuessTheNumber-v0"


def answers(observations: list[str]) -> list[str]:
    out = []
    for observation in observations:
        solution = next(p["solution"] for p in PROBLEMS if p["problem"] in observation)
        out.append(f"```python\n{solution}\n```")
    return out


def run(vec, steps: int, act, warmup: int = 2) -> float:
    """Steps per second of ``vec`` over ``steps`` batched steps (after ``warmup``): env steps, not batches."""
    obs, _ = vec.reset(seed=0)
    for _ in range(warmup):
        obs = vec.step(act(obs))[0]
    started = time.perf_counter()
    for _ in range(steps):
        obs, rewards, *_ = vec.step(act(obs))
    seconds = time.perf_counter() - started
    return steps * vec.num_envs / seconds, seconds / steps


def backends(args: argparse.Namespace, cpus: int) -> list[tuple[str, str, dict]]:
    ray_kwargs = {"num_cpus": 1, "envs_per_actor": -(-args.num_envs // cpus)}  # one actor per CPU
    return [
        ("sync", "sync", {}),
        ("async", "async", {"num_workers": cpus}),
        ("ray", "ray", ray_kwargs),
        ("ray + sandbox service", "ray", {**ray_kwargs, "sandbox": True}),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed batched steps of the code envs")
    parser.add_argument("--trivial-steps", type=int, default=200, help="timed batched steps of the trivial env")
    parser.add_argument("--address", default=None, help="a running Ray cluster (host:port, or 'auto'); default: start a local one")
    args = parser.parse_args()

    import ray

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(include_dashboard=False)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    nodes = sum(1 for n in ray.nodes() if n["Alive"])
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "problems.jsonl")
        with open(data, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in code_rows())
        rows = []
        for name, mode, kwargs in backends(args, cpus):
            code_kwargs = {**kwargs, "autoreset_mode": "same_step"}
            with gem_core.make_vec("code:CodeContest", args.num_envs, vectorization_mode=mode, vector_kwargs=code_kwargs, data_files=data) as vec:
                code_rate, _ = run(vec, args.steps, answers)
            trivial_kwargs = {k: v for k, v in kwargs.items() if k != "sandbox"}
            with gem_core.make_vec(TRIVIAL_ID, args.num_envs, vectorization_mode=mode, vector_kwargs=trivial_kwargs) as vec:
                _, per_step = run(vec, args.trivial_steps, lambda obs: ["\\boxed{25}"] * len(obs))
            rows.append((name, code_rate, per_step * 1000))
    sync_ms = rows[0][2]
    print(f"{args.num_envs} envs; Ray cluster: {nodes} node(s), {cpus} CPUs; this machine: {os.cpu_count()} cores")
    print(f"{'backend':<24}{'code env steps/s':>18}{'trivial ms/step':>18}{'overhead vs sync':>18}")
    for name, rate, ms in rows:
        overhead = "" if name == "sync" else f"{ms - sync_ms:+.2f} ms"
        print(f"{name:<24}{rate:>18.1f}{ms:>18.2f}{overhead:>18}")
    ray.shutdown()


if __name__ == "__main__":
    main()
