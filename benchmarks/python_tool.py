"""Python tool: gem-core's sandbox against gem-llm's PythonCodeTool, in one run.

    python benchmarks/python_tool.py                 # gem-llm imported here, or from --peer-python
    python benchmarks/python_tool.py --calls 500 --workers 8
    nox -s bench_tools

Measures, for the same small snippet (``<python>print(sum(range(100)))</python>`` through each
tool's own action API): p50/p99 latency of sequential calls and calls/s with 1 and 16 concurrent
callers; calls/s and p99 latency with 64 concurrent callers (a rollout's worth of envs calling at
once; gem-core through the process's shared pool, sized to the machine unless ``--workers``); the
p50 of a snippet that imports numpy (gem-core: a sandbox made with numpy preloaded, as a
numpy-heavy workload would make it); how long a 1 s timeout takes to come back (``while True: pass``);
and the hostile snippets of ``tests/tools/hostile_snippets.py`` against both tools (gem-core's
result asserted in the tests, the peer's only recorded here). When gem-llm imports in this
interpreter, the two tools' latencies are taken in alternating chunks (see ``latencies``), so that
the VM's drift does not enter the ratio; from ``--peer-python`` they are taken after gem-core's.

The peer runs as an installed user would run it: ``sandbox_type="none"`` (its default), with its
interpreter's ``bin`` first on PATH (it starts ``python`` from PATH; an activated venv does this).
Its ``sandbox_type="bwrap"`` is tried once and reported. Hostile snippets marked destructive (kill
every process, mount over /tmp, exhaust memory or pids) are NOT run against the peer: unisolated,
they would damage the benchmark machine. The others run against the peer in a child process under
a safety harness -- a private mount namespace when ``unshare`` is available, RLIMIT_AS 4 GiB,
RLIMIT_FSIZE 256 MiB -- which limits harm to this machine and is not the peer's own isolation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "tools"))  # the hostile snippets live with the tests

SNIPPET = "print(sum(range(100)))"
ACTION = f"<python>{SNIPPET}</python>"
NUMPY_SNIPPET = "import numpy as np\nprint(int(np.arange(100).sum()))"  # gem-core: a pool that preloads numpy
NUMPY_ACTION = f"<python>{NUMPY_SNIPPET}</python>"
DEFAULT_PEER_PYTHON = "/tmp/peer/bin/python"


# -- measuring -------------------------------------------------------------------------------------


def latencies(calls: dict[str, Callable[[], Any]], n: int, rounds: int = 10, warmup: int = 10) -> dict[str, dict[str, float]]:
    """p50/p99 (ms) of ``n`` back-to-back calls of each tool, and the calls/s they make.

    With several tools, the calls go in ``rounds`` alternating chunks, so that each tool's numbers
    come from the same stretch of time: a shared VM's speed drifts by tens of percent within
    minutes, and one tool measured after the other would carry that drift into the ratio. Each
    chunk starts with ``warmup`` untimed calls, so that a tool that rested while the other ran
    (gem-core's workers finish their clean-up then) is timed back-to-back, not rested."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    spent = dict.fromkeys(calls, 0.0)
    for chunk in _chunks(n, rounds if len(calls) > 1 else 1):
        for name, call in calls.items():
            for _ in range(warmup):
                call()
            started = time.perf_counter()
            for _ in range(chunk):
                t = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t)
            spent[name] += time.perf_counter() - started
    return {name: _stats(times[name], spent[name]) for name in calls}


def _chunks(n: int, rounds: int) -> list[int]:
    return [n // rounds + (i < n % rounds) for i in range(rounds)]


def _stats(times: list[float], spent: float) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "rate_1": len(times) / spent,
    }


def paced(calls: dict[str, Callable[[], Any]], n: int, gap: float = 0.05) -> dict[str, float]:
    """p50 latency (ms) of calls made ``gap`` seconds apart: a tool that is not saturated, as in a
    rollout where calls are separated by generation time. Several tools take turns, call by call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            time.sleep(gap)
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def throughput(call: Callable[[], Any], n: int, concurrency: int) -> float:
    """Calls/s of ``n`` calls made by ``concurrency`` threads at once."""
    return many_callers(call, n, concurrency)["rate"]


def many_callers(call: Callable[[], Any], n: int, concurrency: int) -> dict[str, float]:
    """Calls/s and p99 latency (ms, queueing included) of ``n`` calls made by ``concurrency`` threads at once."""

    def timed_call(_: int) -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed_call, range(concurrency)))  # warm-up
        started = time.perf_counter()
        times = sorted(pool.map(timed_call, range(n)))
        elapsed = time.perf_counter() - started
    return {"rate": n / elapsed, "p99_ms": 1000 * times[min(n - 1, int(0.99 * n))]}


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = call()
    return out, time.perf_counter() - started


# -- gem-core --------------------------------------------------------------------------------------


def bench_ours(calls: int, concurrency: int, workers: int | None, many: int, peer: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """gem-core's numbers; with ``peer`` (gem-llm's tool, in this process), the latencies of both,
    measured in alternating turns (see ``latencies``)."""
    from gem_core.tools.python import DEFAULT_PRELOAD, PythonSandbox, PythonTool

    if workers is not None:
        from gem_core.tools.sandbox import configure_shared_pool

        configure_shared_pool(workers)
    with PythonSandbox(timeout=5.0) as sandbox, PythonSandbox(timeout=5.0, preload=(*DEFAULT_PRELOAD, "numpy")) as with_numpy:
        tool = PythonTool(sandbox=sandbox)
        numpy_tool = PythonTool(sandbox=with_numpy)
        first = tool.execute(ACTION)
        assert first is not None and first.ok and "4950" in first.observation, first
        numpy_first = numpy_tool.execute(NUMPY_ACTION)
        assert numpy_first is not None and "4950" in numpy_first.observation, numpy_first
        plain = {"ours": lambda: tool.execute(ACTION)}
        numpy = {"ours": lambda: numpy_tool.execute(NUMPY_ACTION)}
        if peer is not None:
            plain["peer"] = lambda: peer.execute_action(ACTION)
            numpy["peer"] = lambda: peer.execute_action(NUMPY_ACTION)
        rows: dict[str, dict[str, Any]] = latencies(plain, calls)
        for name, ms in paced(plain, max(20, calls // 5)).items():
            rows[name]["paced_ms"] = ms
        for name, row in latencies(numpy, max(20, calls // 5)).items():
            rows[name]["numpy_p50_ms"] = row["p50_ms"]
        ours = rows["ours"]
        ours["rate_c"] = throughput(lambda: tool.execute(ACTION), calls, concurrency)
        ours["many"] = many_callers(lambda: tool.execute(ACTION), max(calls, 2 * many), many)
        ours["workers"] = sandbox.workers
        late, seconds = timed(lambda: sandbox.run("while True: pass", timeout=1.0))
        ours["timeout_s"] = seconds
        ours["timeout_ok"] = bool(late.timed_out)
    return ours, rows.get("peer", {})


def hostile_ours(timeout: float) -> list[dict[str, Any]]:
    from hostile_snippets import HOSTILE, hostile_host

    from gem_core.tools.python import PythonTool

    rows = []
    with hostile_host() as host:
        tool = PythonTool(timeout=timeout, workers=2, max_output_bytes=4096)
        try:
            for attack in HOSTILE:
                code = host.fill(attack.code)
                result, seconds = timed(lambda code=code: tool.sandbox.run(code, timeout=timeout))
                text = result.stdout + result.stderr
                breach = attack.breached(text, host)
                if breach is None and seconds > timeout + 1.0:
                    breach = f"took {seconds:.1f}s with a {timeout:g}s timeout"
                try:
                    attack.check(result, host)
                    strict = "ok"
                except AssertionError as exc:
                    strict = f"check failed: {exc}"
                rows.append({"name": attack.name, "breach": breach, "strict": strict, "seconds": seconds})
        finally:
            tool.close()
    return rows


# -- the peer (gem-llm), in whatever interpreter has it -----------------------------------------------


def peer_tool(timeout: float, sandbox_type: str = "none") -> Any:
    from gem.tools.python_code_tool import PythonCodeTool

    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    return PythonCodeTool(timeout=timeout, sandbox_type=sandbox_type)


def checked_peer_tool() -> Any:
    tool = peer_tool(5)
    for action in (ACTION, NUMPY_ACTION):
        valid, error, obs, _ = tool.execute_action(action)
        assert valid and not error and "4950" in obs, obs
    return tool


def peer_perf(calls: int, concurrency: int, many: int, latency_rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """The peer's numbers; its latencies measured here unless given (taken in turns with ours)."""
    tool = checked_peer_tool()
    if latency_rows:
        row = dict(latency_rows)
    else:
        row = latencies({"peer": lambda: tool.execute_action(ACTION)}, calls)["peer"]
        row["paced_ms"] = paced({"peer": lambda: tool.execute_action(ACTION)}, max(20, calls // 5))["peer"]
        numpy = {"peer": lambda: tool.execute_action(NUMPY_ACTION)}
        row["numpy_p50_ms"] = latencies(numpy, max(20, calls // 5))["peer"]["p50_ms"]
    row["rate_c"] = throughput(lambda: tool.execute_action(ACTION), calls, concurrency)
    row["many"] = many_callers(lambda: tool.execute_action(ACTION), max(calls, 2 * many), many)
    (_, _, obs, _), seconds = timed(lambda: peer_tool(1).execute_action("<python>while True: pass</python>"))
    row["timeout_s"] = seconds
    row["timeout_ok"] = "timed out" in obs
    (_, error, obs, _), _ = timed(lambda: peer_tool(5, "bwrap").execute_action(ACTION))
    row["bwrap_mode"] = "works" if not error and "4950" in obs else f"fails here: {obs.strip()[:120]!r}"
    return row


def _safety_harness() -> None:
    """Limits for the peer's hostile run (its children inherit them): harm to this machine stays small."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))


def peer_hostile(timeout: float) -> list[dict[str, Any]]:
    from hostile_snippets import HOSTILE, hostile_host

    rows = []
    with hostile_host() as host:
        tool = peer_tool(timeout)
        for attack in HOSTILE:
            if attack.destructive:
                rows.append({"name": attack.name, "breach": None, "not_run": True, "seconds": 0.0})
                continue
            action = f"<python>{host.fill(attack.code)}</python>"
            (_, _, obs, _), seconds = timed(lambda action=action: tool.execute_action(action))
            breach = attack.breached(obs, host)
            if breach is None and seconds > timeout + 1.0:
                breach = f"took {seconds:.1f}s with a {timeout:g}s timeout"
            blocked = "Execution blocked" in obs
            rows.append({"name": attack.name, "breach": breach, "blocked_by_filter": blocked, "seconds": seconds})
    return rows


def peer_here() -> bool:
    try:
        import gem.tools.python_code_tool  # noqa: F401
    except ImportError:
        return False
    return True


def run_peer(python: str | None, calls: int, concurrency: int, many: int, timeout: float, latency_rows: dict[str, Any] | None = None) -> dict[str, Any] | str:
    """The peer's numbers, measured here if ``gem`` imports (its latencies already taken, in turns
    with ours, when given), else in ``python`` (a subprocess, after ours)."""
    if peer_here():
        perf = peer_perf(calls, concurrency, many, latency_rows)
        perf["interleaved"] = bool(latency_rows)
        hostile = _in_child(sys.executable, ["--peer-hostile", "--timeout", str(timeout)])
        return {"perf": perf, "hostile": hostile, "python": sys.executable}
    if python is None or not Path(python).exists():
        return "gem-llm is not installed here (pip install -e '.[bench]'), and no --peer-python was found"
    perf = _in_child(python, ["--peer-perf", "--calls", str(calls), "--concurrency", str(concurrency), "--many", str(many)])
    hostile = _in_child(python, ["--peer-hostile", "--timeout", str(timeout)])
    return {"perf": perf, "hostile": hostile, "python": python}


def _in_child(python: str, args: list[str]) -> Any:
    hostile = "--peer-hostile" in args
    argv = [python, str(Path(__file__).resolve()), *args]
    # The canary secret is in the peer's environment from its start, as a host secret would be.
    from hostile_snippets import SECRET, SECRET_VAR

    env = {**os.environ, SECRET_VAR: SECRET}
    if hostile and shutil.which("unshare") and os.geteuid() == 0:
        argv = ["unshare", "--mount", "--propagation", "private", *argv]  # a mount it makes stays there
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        preexec_fn=_safety_harness if hostile else None,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"peer run failed ({' '.join(args)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- report ----------------------------------------------------------------------------------------


def print_report(
    ours: dict[str, Any],
    peer: dict[str, Any] | str,
    hostile: list[dict[str, Any]],
    concurrency: int,
    calls: int,
    many: int,
) -> None:
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"\nPython tool, {calls} calls of {SNIPPET!r} through each tool's action API ({os.cpu_count()} cpus, load {load})\n")
    header = (
        f"| tool | isolation | p50 ms | p99 ms | p50 ms, paced 20/s | p50 ms, numpy snippet | calls/s (1) | calls/s ({concurrency}) | 1 s timeout returns in |"
    )
    print(header)
    print("|" + "---|" * 9)
    print(
        f"| gem-core PythonTool ({ours['workers']} shared workers) | bwrap | {ours['p50_ms']:.2f} | {ours['p99_ms']:.2f} | "
        f"{ours['paced_ms']:.2f} | {ours['numpy_p50_ms']:.2f} | {ours['rate_1']:.0f} | {ours['rate_c']:.0f} "
        f"| {ours['timeout_s']:.2f} s |"
    )
    if isinstance(peer, str):
        print(f"| gem-llm PythonCodeTool | - | {peer} | | | | | | |")
        return
    p = peer["perf"]
    print(
        f"| gem-llm PythonCodeTool | none (its default) | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | "
        f"{p['paced_ms']:.2f} | {p['numpy_p50_ms']:.2f} | {p['rate_1']:.0f} | {p['rate_c']:.0f} | {p['timeout_s']:.2f} s |"
    )
    print(f"\n{many} concurrent callers ({max(calls, 2 * many)} calls):\n")
    print("| tool | calls/s | p99 ms (queueing included) |")
    print("|---|---:|---:|")
    print(f"| gem-core PythonTool ({ours['workers']} shared workers) | {ours['many']['rate']:.0f} | {ours['many']['p99_ms']:.1f} |")
    print(f"| gem-llm PythonCodeTool | {p['many']['rate']:.0f} | {p['many']['p99_ms']:.1f} |")
    turns = "in alternating turns" if p.get("interleaved") else "one tool after the other"
    print(f"\nLatencies measured {turns}; calls/s and the timeout, one tool after the other.")
    print(
        f"p50 speed-up: {p['p50_ms'] / ours['p50_ms']:.1f}x back-to-back, {p['paced_ms'] / ours['paced_ms']:.1f}x paced, "
        f"{p['numpy_p50_ms'] / ours['numpy_p50_ms']:.1f}x with numpy; "
        f"calls/s at {concurrency} concurrent: {ours['rate_c'] / p['rate_c']:.1f}x, at {many}: "
        f"{ours['many']['rate'] / p['many']['rate']:.1f}x"
    )
    print(f"gem-llm sandbox_type='bwrap': {p['bwrap_mode']}")
    peer_rows = {row["name"]: row for row in peer["hostile"]}
    print("\nHostile snippets (gem-core asserted in tests/tools/test_python_security.py; gem-llm recorded)\n")
    print("| snippet | gem-core | gem-llm (none) |")
    print("|---|---|---|")
    contained = 0
    for row in hostile:
        mine = "contained" if row["breach"] is None and row["strict"] == "ok" else f"NOT CONTAINED: {row['breach'] or row['strict']}"
        contained += mine == "contained"
        other = peer_rows.get(row["name"], {})
        if other.get("not_run"):
            theirs = "not run (destructive without isolation)"
        elif other.get("breach"):
            theirs = f"got through: {other['breach']}"
        elif other.get("blocked_by_filter"):
            theirs = "blocked by its keyword filter"
        else:
            theirs = "no breach seen"
        print(f"| {row['name']} | {mine} | {theirs} |")
    breaches = sum(1 for r in peer["hostile"] if r.get("breach"))
    print(f"\ngem-core: {contained}/{len(hostile)} contained.  gem-llm: {breaches} got through, {sum(1 for r in peer['hostile'] if r.get('not_run'))} not run.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per measurement (default 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent callers for the throughput column")
    parser.add_argument("--many", type=int, default=64, help="concurrent callers for the many-callers row")
    parser.add_argument("--workers", type=int, default=None, help="size of gem-core's shared sandbox pool (default: fitted to the cores)")
    parser.add_argument("--timeout", type=float, default=2.0, help="timeout of the hostile snippets (s)")
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="an interpreter with gem-llm, if this one lacks it")
    parser.add_argument("--json", help="also write the raw numbers to this file")
    parser.add_argument("--peer-perf", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peer-hostile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_perf:
        print(json.dumps(peer_perf(args.calls, args.concurrency, args.many)))
        return 0
    if args.peer_hostile:
        print(json.dumps(peer_hostile(args.timeout)))
        return 0
    peer_tool_here = checked_peer_tool() if peer_here() else None
    ours, peer_latencies = bench_ours(args.calls, args.concurrency, args.workers, args.many, peer_tool_here)
    peer = run_peer(args.peer_python, args.calls, args.concurrency, args.many, args.timeout, peer_latencies)
    hostile = hostile_ours(args.timeout)
    print_report(ours, peer, hostile, args.concurrency, args.calls, args.many)
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": ours, "peer": peer, "hostile": hostile}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
