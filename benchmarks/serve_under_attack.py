"""`gem-core serve` under hostile clients: honest clients' step latency and errors before and during an attack.

    python benchmarks/serve_under_attack.py [--clients 64] [--seconds 10]
    nox -s bench_openenv        (after benchmarks/openenv_serving.py)

The server is ``gem-core serve game:GuessTheNumber-v0`` in its own process, on loopback. ``--clients`` honest
OpenEnv clients (``GenericEnvClient``, async) play for ``--seconds``; then they play as long again while
hostile clients connect: silent and trickling TCP connections (slow), 1.5 M-character actions and 17 MiB
frames (oversized), WebSockets that reset and go quiet (idle), JSON arrays, 5000-digit seeds, binary frames,
HTTP MCP session requests and 64 MiB bodies, 4 of them sent whole (malformed), 64 WebSockets at once that
offer permessage-deflate and send a 15 KiB frame that inflates to 15 MiB, and 4 that send a 15 MiB message
of one letter (deflate), and web pages: a browser's Origin, a DNS-rebinding Host (cross-origin). It prints
the honest clients' p50/p99 step latency and errors in each phase, what the server refused or closed, what
got through (a web page served, a 413 lost to a reset), the server's memory (resident, and peak), and
checks that nothing is left behind: every env closed, no child process, the server's open file descriptors
back where they were. Bounded (about 2 x ``--seconds`` plus the idle timeout) and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import time
import zlib

ENV_ID = "game:GuessTheNumber-v0"
IDLE_TIMEOUT = 3.0
HEADER_TIMEOUT = 2.0


def moves(seed: int) -> list[str]:
    return [f"\\boxed{{{(seed * 7 + 3 * k) % 20 + 1}}}" for k in range(40)]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def memory_mib(pid: int) -> tuple[float, float]:
    """The process's resident memory now and its peak so far (VmRSS, VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        text = status.read()
    now, peak = (int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) / 1024 for key in ("VmRSS", "VmHWM"))
    return now, peak


def child_processes(pid: int) -> int:
    """How many processes have ``pid`` as their parent (a served env's sandboxes; none may outlive their session)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    count += int(stat.read().rsplit(")", 1)[1].split()[1]) == pid
            except (OSError, IndexError, ValueError):
                pass
    return count


def deflate_bomb(inflated_bytes: int) -> bytes:
    """One masked text frame, compressed as permessage-deflate sends it (RSV1 set, a 12-bit window, the server's
    old offer), that inflates to ``inflated_bytes`` of one letter: about a thousand times smaller on the wire."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -12)
    payload = (compressor.compress(b"x" * inflated_bytes) + compressor.flush(zlib.Z_SYNC_FLUSH))[:-4]
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    size = len(payload)
    length = bytes([0x80 | 126]) + size.to_bytes(2, "big") if size < 65536 else bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return bytes([0xC1]) + length + mask + masked  # FIN, RSV1 (compressed), text


async def handshake(host: str, port: int, headers: dict[str, str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A WebSocket opening handshake written by hand; the streams and the server's status line."""
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = ["GET /ws HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    writer.write(("\r\n".join(lines + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n").encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    return reader, writer, head.split(b"\r\n", 1)[0]


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

    sent: dict[str, int] = {"slow": 0, "oversized": 0, "idle": 0, "malformed": 0, "deflate": 0, "cross-origin": 0}
    #: what should have been refused and was not: cross-origin requests served, 413s lost to a reset
    got_through: dict[str, int] = {"cross-origin served": 0, "413 lost": 0}
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
            for byte in b"GET /health HTTP/1.1\r\nHost: localhost\r\n":
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
            try:
                ws = await connect(ws_url, open_timeout=30)
                sockets.append(ws)
                await ws.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
                await ws.recv()
                sent["idle"] += 1
            except Exception:
                pass
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
                b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(mcp) + mcp,
                b"POST /step HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 67108864\r\n\r\n{",
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

    async def whole_bodies() -> None:
        """64 MiB bodies sent whole before reading the answer, one at a time: the 413 must reach the client."""
        body = b"x" * (64 << 20)
        for _ in range(4):
            if time.monotonic() > deadline:
                break
            head = f"POST /step HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            answer = b""
            try:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(head.encode() + body)
                await writer.drain()
                answer = await asyncio.wait_for(reader.read(4096), 30)
                writer.close()
            except Exception:
                pass
            sent["malformed"] += 1
            got_through["413 lost"] += not answer.startswith(b"HTTP/1.1 413")
            await asyncio.sleep(1.0)

    async def deflate() -> None:
        """64 WebSockets at once (issue 63's 64 sessions) offering permessage-deflate, each sending one 15 KiB frame that
        inflates to 15 MiB, compressed whether or not the server took the extension; and 4 library clients that send a
        15 MiB message of one letter (compressed only if the server took the extension)."""
        bomb = deflate_bomb(15 << 20)
        offer = {"Host": f"{host}:{port}", "Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits"}

        async def one() -> None:
            try:
                reader, writer, status = await handshake(host, port, offer)
                if status.startswith(b"HTTP/1.1 101"):
                    writer.write(bomb)
                    await writer.drain()
                    await asyncio.wait_for(reader.read(), 30)  # until the server closes (or its idle timeout does)
                writer.close()
            except Exception:
                pass
            sent["deflate"] += 1

        async def library() -> None:
            try:
                async with connect(ws_url, compression="deflate", max_size=None, open_timeout=30) as ws:
                    await ws.send("x" * (15 << 20))
                    await asyncio.wait_for(ws.recv(), 30)
            except Exception:
                pass
            sent["deflate"] += 1

        await asyncio.sleep(1.0)  # the honest clients have their sessions by then
        await asyncio.gather(*(one() for _ in range(64)), *(library() for _ in range(4)))

    async def cross_origin() -> None:
        """Web pages: a WebSocket and an HTTP reset with a browser's Origin, and a WebSocket whose Host is the page's
        own name resolved to 127.0.0.1 (DNS rebinding). Each must be refused (403)."""
        from websockets.exceptions import InvalidStatus

        reset = b"{}"
        while time.monotonic() < deadline:
            try:
                async with connect(ws_url, origin="http://evil.example", open_timeout=30) as ws:
                    await ws.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
                    await ws.recv()
                    got_through["cross-origin served"] += 1
            except InvalidStatus:
                pass
            except Exception:
                pass
            try:
                reader, writer, status = await handshake(host, port, {"Host": f"evil.example:{port}"})
                got_through["cross-origin served"] += status.startswith(b"HTTP/1.1 101")
                writer.close()
            except Exception:
                pass
            try:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(
                    b"POST /reset HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(reset), reset)
                )
                await writer.drain()
                answer = await asyncio.wait_for(reader.read(4096), 30)
                got_through["cross-origin served"] += answer.startswith(b"HTTP/1.1 200")
                writer.close()
            except Exception:
                pass
            sent["cross-origin"] += 3
            await asyncio.sleep(0.2)

    try:
        await asyncio.gather(slow(), oversized(), idle(), malformed(), whole_bodies(), deflate(), cross_origin())
    finally:
        for writer in writers:
            writer.close()
    return {**sent, **got_through}


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
        [*command, "serve", ENV_ID, "--port", "0", "--max-sessions", str(args.clients + 96)]
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
        rss_start, _ = memory_mib(server.pid)
        base_latencies, base_errors = asyncio.run(honest(url, args.clients, args.seconds))
        _, peak_alone = memory_mib(server.pid)

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
        rss_after, peak_attack = memory_mib(server.pid)
        children = child_processes(server.pid)
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
    through = {kind: sent.pop(kind, 0) for kind in ("cross-origin served", "413 lost")}
    print(f"\nhostile clients sent: {', '.join(f'{k} {v}' for k, v in sent.items())}")
    print(f"got through: {', '.join(f'{k} {v}' for k, v in through.items())}")
    print(
        f"server memory (MiB): resident {rss_start:.0f} at start, peak {peak_alone:.0f} alone, peak {peak_attack:.0f} with hostile clients, resident {rss_after:.0f} after"
    )
    print(f"server log: {len(err.splitlines())} lines ({len(err)} bytes); kinds logged: {events}")
    print(
        f"left behind: open envs {built - closed} ({built} built, {closed} closed); child processes {children}; "
        f"server fds {fds_before} before, {fds_after} after"
    )
    for error in (base_errors + attack_errors)[:5]:
        print("  honest error:", error)
    ok = built == closed and not children and fds_after <= fds_before and not base_errors and not attack_errors and not any(through.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
