"""`gem-core serve` under hostile clients: honest clients' step latency and errors before and during an attack.

    python benchmarks/serve_under_attack.py [--clients 64] [--seconds 10]
    nox -s bench_openenv        (after benchmarks/openenv_serving.py)

The server is ``gem-core serve game:GuessTheNumber-v0`` in its own process, on loopback. ``--clients`` honest
OpenEnv clients (``GenericEnvClient``, async) play for ``--seconds``; then they play as long again while
hostile clients connect: silent and trickling TCP connections (slow), 1 MiB actions and 17 MiB frames
(oversized), WebSockets that reset and go quiet (idle), JSON arrays, 5000-digit seeds, binary frames, HTTP
MCP session requests and 64 MiB bodies (malformed). It prints the honest clients' p50/p99 step latency and
errors in each phase, what the server refused or closed, and checks that nothing is left behind: every env
closed and the server's open file descriptors back where they were. Bounded (about 2 x ``--seconds`` plus
the idle timeout) and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time

ENV_ID = "game:GuessTheNumber-v0"
IDLE_TIMEOUT = 3.0
HEADER_TIMEOUT = 2.0


def moves(seed: int) -> list[str]:
    return [f"\\boxed{{{(seed * 7 + 3 * k) % 20 + 1}}}" for k in range(40)]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def honest(url: str, clients: int, seconds: float) -> tuple[list[float], list[str]]:
    """``clients`` sessions stepping until ``seconds`` pass; each step's latency, and every error's line."""
    from openenv.core.generic_client import GenericEnvClient

    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    async def play(index: int) -> None:
        try:
            async with GenericEnvClient(base_url=url, message_timeout_s=60) as session:
                seed, k = index, 0
                await session.reset(seed=seed)
                while time.monotonic() < deadline:
                    started = time.perf_counter()
                    result = await session.step({"action": moves(seed)[k % 40]})
                    latencies.append(time.perf_counter() - started)
                    k += 1
                    if result.done:
                        seed, k = seed + clients, 0
                        await session.reset(seed=seed)
        except Exception as err:  # counted, shown in the table
            errors.append(f"{type(err).__name__}: {str(err)[:120]}")

    await asyncio.gather(*(play(i) for i in range(clients)))
    return latencies, errors


async def hostile(host: str, port: int, seconds: float) -> dict[str, int]:
    """Every kind of bad client at once for ``seconds``; how many of each were sent."""
    from websockets.asyncio.client import connect

    sent: dict[str, int] = {"slow": 0, "oversized": 0, "idle": 0, "malformed": 0}
    deadline = time.monotonic() + seconds
    ws_url = f"ws://{host}:{port}/ws"
    writers: list[asyncio.StreamWriter] = []

    async def slow() -> None:
        while time.monotonic() < deadline:  # silent connections, 50 at a time, and one trickling request each round
            for _ in range(50):
                try:
                    _, writer = await asyncio.open_connection(host, port)
                    writers.append(writer)
                    sent["slow"] += 1
                except OSError:
                    pass
            _, trickle = await asyncio.open_connection(host, port)
            writers.append(trickle)
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":
                if time.monotonic() > deadline or trickle.is_closing():
                    break
                try:
                    trickle.write(bytes([byte]))
                    await trickle.drain()
                except OSError:
                    break
                await asyncio.sleep(0.1)
            sent["slow"] += 1

    async def oversized() -> None:
        while time.monotonic() < deadline:
            try:
                async with connect(ws_url, max_size=None, open_timeout=30) as ws:
                    await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
                    await ws.recv()
                    await ws.send(json.dumps({"type": "step", "data": {"action": "<bash>" * (1 << 18)}}))  # 1.5 M characters
                    await ws.recv()
                    sent["oversized"] += 1
                    await ws.send("x" * (17 << 20))  # over the 16 MiB frame limit: closed with 1009
                    await ws.recv()
            except Exception:
                sent["oversized"] += 1
            await asyncio.sleep(0.2)

    async def idle() -> None:
        sockets = []
        for _ in range(8):
            ws = await connect(ws_url, open_timeout=30)
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
            await ws.recv()
            sockets.append(ws)
            sent["idle"] += 1
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        for ws in sockets:
            await ws.close()

    async def malformed() -> None:
        bad = ["[1, 2]", '{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}", "[" * 100_000, b"\x00\x01binary"]
        mcp = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}).encode()
        while time.monotonic() < deadline:
            try:
                async with connect(ws_url, open_timeout=30) as ws:
                    for message in bad:
                        await ws.send(message)
                        await ws.recv()
                        sent["malformed"] += 1
            except Exception:
                pass
            for request in (
                b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(mcp) + mcp,
                b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 67108864\r\n\r\n{",
            ):
                try:
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(request)
                    await writer.drain()
                    await asyncio.wait_for(reader.read(4096), 30)
                    writer.close()
                    sent["malformed"] += 1
                except Exception:
                    pass
            await asyncio.sleep(0.1)

    try:
        await asyncio.gather(slow(), oversized(), idle(), malformed())
    finally:
        for writer in writers:
            writer.close()
    return sent


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hostile-only", metavar="HOST:PORT", help=argparse.SUPPRESS)  # the attacking process
    args = parser.parse_args()
    if args.hostile_only:
        host, port = args.hostile_only.rsplit(":", 1)
        print(json.dumps(asyncio.run(hostile(host, int(port), args.seconds))))
        return 0
    script = os.path.join(os.path.dirname(sys.executable), "gem-core")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "gem_core.cli"]
    server = subprocess.Popen(
        [*command, "serve", ENV_ID, "--port", "0", "--max-sessions", str(args.clients + 32)]
        + ["--idle-timeout", str(IDLE_TIMEOUT), "--header-timeout", str(HEADER_TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)
        server.stdout.readline()  # the auth line
        host, port = url.removeprefix("http://").split(":")
        fds_before = open_fds(server.pid)
        base_latencies, base_errors = asyncio.run(honest(url, args.clients, args.seconds))

        # the attackers in their own process, so that their work does not slow the honest clients' event loop
        attackers = subprocess.Popen(
            [sys.executable, __file__, "--hostile-only", f"{host}:{port}", "--seconds", str(args.seconds)], stdout=subprocess.PIPE, text=True
        )
        attack_latencies, attack_errors = asyncio.run(honest(url, args.clients, args.seconds))
        sent = json.loads(attackers.communicate(timeout=args.seconds + 120)[0] or "{}")
        deadline = time.monotonic() + IDLE_TIMEOUT + HEADER_TIMEOUT + 30  # the server closes what is left, bounded
        while open_fds(server.pid) > fds_before and time.monotonic() < deadline:
            time.sleep(0.25)
        fds_after = open_fds(server.pid)
        server.terminate()
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    built, closed = map(int, re.search(r"stopped: (\d+) envs built, (\d+) closed", out).groups())
    events: dict[str, int] = {}
    for kind in re.findall(r"gem-core serve: ([a-z ]+):", err):
        events[kind] = events.get(kind, 0) + 1

    print(f"gem-core serve {ENV_ID}: {args.clients} honest clients, {args.seconds:g} s per phase (loopback)\n")
    print("| phase | honest steps | p50 ms | p99 ms | honest errors |")
    print("|---|---:|---:|---:|---:|")
    for name, latencies, errors in (("alone", base_latencies, base_errors), ("with hostile clients", attack_latencies, attack_errors)):
        p50, p99 = percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3
        print(f"| {name} | {len(latencies)} | {p50:.1f} | {p99:.1f} | {len(errors)} |")
    print(f"\nhostile clients sent: {', '.join(f'{k} {v}' for k, v in sent.items())}")
    print(f"server log: {len(err.splitlines())} lines ({len(err)} bytes); kinds logged: {events}")
    print(f"left behind: open envs {built - closed} ({built} built, {closed} closed); server fds {fds_before} before, {fds_after} after")
    for error in (base_errors + attack_errors)[:5]:
        print("  honest error:", error)
    ok = built == closed and fds_after <= fds_before and not base_errors and not attack_errors
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
