"""The terminal env's command latency: one `true` in a warm sandboxed shell (bubblewrap, the supervisor, the
agent's confinement and PID namespace), beside the peer, the same command in a plain persistent bash over pipes
(no sandbox); a sandbox's start with its first command; and the checks at submit.

    python benchmarks/terminal_latency.py [--rounds 6] [--commands 300] [--starts 30]

Rounds interleave the two so the machine's load falls on both; the table gives the median of the rounds' p50s
and their range. Needs bubblewrap (`apt install bubblewrap`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import gem_core

SENTINEL = b"__gem_done__"


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def sandboxed(commands: int) -> list[float]:
    """One `true` at a time in a warm sandboxed shell (a new episode every 190 commands: 200 turns at most)."""
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=10.0, max_turns=200)
    latencies: list[float] = []
    try:
        while len(latencies) < commands:
            env.reset(seed=len(latencies))
            env.step(bash("true"))  # the shell is warm
            for _ in range(min(190, commands - len(latencies))):
                started = time.perf_counter()
                observation = env.step(bash("true"))[0]
                latencies.append(time.perf_counter() - started)
                assert observation == "[exit code: 0]", observation
        return latencies
    finally:
        env.close()


def plain(commands: int) -> list[float]:
    """The peer: a persistent bash, each command followed by a sentinel it echoes."""
    shell = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert shell.stdin is not None and shell.stdout is not None
    try:
        latencies = []
        for _ in range(commands):
            started = time.perf_counter()
            shell.stdin.write(b"true; echo " + SENTINEL + b" $?\n")
            line = b""
            while not line.startswith(SENTINEL):
                line = shell.stdout.readline()
            latencies.append(time.perf_counter() - started)
        return latencies
    finally:
        shell.kill()
        shell.wait()


def starts_and_checks(starts: int) -> tuple[list[float], list[float]]:
    """Per episode of the reference solution: the sandbox's start with its first command, and the step that
    submits (the checks)."""
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=10.0)
    start, check = [], []
    try:
        for seed in range(starts):
            env.reset(seed=seed)
            for step in range(env.max_turns):
                started = time.perf_counter()
                _, reward, terminated, truncated, _ = env.step(env.oracle_action())
                if step == 0:  # the sandbox starts with the first command
                    start.append(time.perf_counter() - started)
                if terminated or truncated:
                    check.append(time.perf_counter() - started)
                    assert reward == 1.0, reward
                    break
    finally:
        env.close()
    return start, check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--starts", type=int, default=30)
    args = parser.parse_args(argv)
    rows: dict[str, list[float]] = {"sandboxed shell": [], "plain bash (peer)": []}
    for _ in range(args.rounds):
        rows["sandboxed shell"].append(p50_ms(sandboxed(args.commands)))
        rows["plain bash (peer)"].append(p50_ms(plain(args.commands)))
    start, check = starts_and_checks(args.starts)
    print(f"{os.cpu_count()} CPUs, {args.rounds} rounds of {args.commands} commands, {args.starts} episodes\n")
    print("| one `true` | p50, median of rounds [range] |\n|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.2f} ms [{min(values):.2f}, {max(values):.2f}] |")
    print(f"| a sandbox's start and first command | {p50_ms(start):.1f} ms |")
    print(f"| the checks at submit (the oracle's episodes, reward 1.0) | {p50_ms(check):.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
