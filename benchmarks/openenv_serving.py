"""Steps/s of a served game over OpenEnv's socket (1 and 64 concurrent clients) against in-process play,
in the same run.

    python benchmarks/openenv_serving.py [--env game:GuessTheNumber-v0] [--steps 2000] [--clients 1,64]
    nox -s bench_openenv

The server is ``gem-core serve`` in its own process (OpenEnv's ``create_app`` under uvicorn, one env per
WebSocket session); the clients are OpenEnv's own ``GenericEnvClient`` (async, all in this process, one
event loop). Every row plays the same fixed moves (seeded episodes, a reset when one ends), so the rows
differ only in where the env runs and how its steps travel. In-process rows time ``env.step`` and
``env.reset`` on one env and on 64 envs stepped in turn. Resets count as steps (each is one request).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from typing import Any

import gem_core

DEFAULT_ENV = "game:GuessTheNumber-v0"


def moves(seed: int) -> list[str]:
    """The fixed moves of episode ``seed`` (a number guess each, the same in every row)."""
    return [f"\\boxed{{{(seed * 7 + 3 * k) % 20 + 1}}}" for k in range(40)]


def in_process(env_id: str, steps: int, num_envs: int) -> float:
    """Steps/s of ``num_envs`` envs in this process, stepped in turn (resets included)."""
    envs = [gem_core.make(env_id) for _ in range(num_envs)]
    state = [[seed, 0] for seed in range(num_envs)]
    for env, (seed, _) in zip(envs, state):
        env.reset(seed=seed)
    done = 0
    started = time.perf_counter()
    while done < steps:
        for env, slot in zip(envs, state):
            seed, k = slot
            _, _, terminated, truncated, _ = env.step(moves(seed)[k % 40])
            slot[1] += 1
            done += 1
            if terminated or truncated:
                slot[0], slot[1] = seed + num_envs, 0
                env.reset(seed=slot[0])
                done += 1
    elapsed = time.perf_counter() - started
    for env in envs:
        env.close()
    return done / elapsed


async def over_socket(url: str, steps: int, clients: int) -> tuple[float, float]:
    """Steps/s of ``clients`` concurrent OpenEnv sessions (``steps`` in all), and the mean ms per request."""
    from openenv.core.generic_client import GenericEnvClient

    per_client = max(1, steps // clients)
    sessions = [GenericEnvClient(base_url=url) for _ in range(clients)]
    for session in sessions:
        await session.connect()
    latencies: list[float] = []

    async def play(index: int, session: Any) -> int:
        seed, k, count = index, 0, 0
        await session.reset(seed=seed)
        while count < per_client:
            t0 = time.perf_counter()
            result = await session.step({"action": moves(seed)[k % 40]})
            latencies.append(time.perf_counter() - t0)
            k += 1
            count += 1
            if result.done:
                seed, k = seed + clients, 0
                await session.reset(seed=seed)
                count += 1
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(play(i, s) for i, s in enumerate(sessions)))
    elapsed = time.perf_counter() - started
    for session in sessions:
        await session.close()
    return sum(counts) / elapsed, 1000 * sum(latencies) / len(latencies)


def start_server(env_id: str, max_sessions: int) -> tuple[subprocess.Popen, str]:
    """``gem-core serve`` in a subprocess on a free port; its base URL."""
    command = [sys.executable, "-m", "gem_core.cli", "serve", env_id, "--port", "0", "--max-sessions", str(max_sessions)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"at (http://\S+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"gem-core serve did not start: {line}{proc.stderr.read()}")
    return proc, match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=DEFAULT_ENV, help=f"the served game (default {DEFAULT_ENV})")
    parser.add_argument("--steps", type=int, default=2000, help="steps per row (default 2000)")
    parser.add_argument("--clients", default="1,64", help="concurrent client counts, comma-separated (default 1,64)")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    rows: list[tuple[str, int, float, str]] = []
    local_1 = in_process(args.env, args.steps, 1)
    local_64 = in_process(args.env, args.steps, 64)
    rows.append(("in-process, 1 env", 1, local_1, "-"))
    rows.append(("in-process, 64 envs in turn", 64, local_64, "-"))
    proc, url = start_server(args.env, max(counts))
    try:
        asyncio.run(over_socket(url, 200, 1))  # warm-up: imports, first connections
        for clients in counts:
            rate, ms = asyncio.run(over_socket(url, args.steps, clients))
            rows.append((f"OpenEnv socket, {clients} client{'s' if clients > 1 else ''}", clients, rate, f"{ms:.2f}"))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"{args.env}: steps/s over OpenEnv's WebSocket (gem-core serve, its own process) vs in-process; {args.steps} steps per row, {os.cpu_count()} CPUs\n")
    print("| where | sessions | steps/s | vs in-process (1 env) | ms per request |")
    print("|---|---:|---:|---:|---:|")
    for name, sessions, rate, ms in rows:
        print(f"| {name} | {sessions} | {rate:,.0f} | {rate / local_1:.3f}x | {ms} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
