"""``gem-core serve``: a real run played by OpenEnv's client and stopped by a signal, and bad invocations
(one line on stderr, exit 2, no traceback: the house style of tests/core/test_cli_errors.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from openenv.core.generic_client import GenericEnvClient
from serve_helpers import guesses, play_local, record
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gem_core import cli

GUESS = "game:GuessTheNumber-v0"


def _script() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "gem-core")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "gem_core.cli"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_runs_until_a_signal_then_stops_cleanly(stop):
    # SIGINT's default disposition in the child: a shell's background job (CI runs its two streams as such)
    # starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler: Ctrl-C's, restored
    proc = subprocess.Popen(
        [*_script(), "serve", GUESS, "--port", "0", "--max-sessions", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(
            rf"serving {re.escape(GUESS)} at (http://127\.0\.0\.1:\d+) \(OpenEnv: GenericEnvClient\(base_url=\.\.\.\), WebSocket /ws\)\n", line
        )
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        auth = proc.stdout.readline()  # read here: communicate() below reads past this file object's buffer
        assert auth == "auth: none, listening on 127.0.0.1 (this machine only); off loopback a token (--token or GEM_SERVE_TOKEN) is required\n"
        actions = guesses(2)
        with GenericEnvClient(base_url=match.group(1)).sync() as client:
            played = [record(client.reset(seed=2))]
            for action in actions:
                result = client.step({"action": action})
                played.append(record(result))
                if result.done:
                    break
            proc.send_signal(stop)  # a session still open: the stop closes it
            out, err = proc.communicate(timeout=60)  # a stop waits up to 5 s for sessions, more on a loaded machine
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert played == play_local(GUESS, 2, actions)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    built, closed = map(int, re.fullmatch(r"stopped: (\d+) envs built, (\d+) closed\n", out).groups())
    assert built == closed >= 2  # OpenEnv's startup check's env and the session's


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(argv)
    return code, capsys.readouterr().err


BAD = [
    (
        ["serve", "game:GuessTheNumbr-v0"],
        "gem-core: error: no env registered as 'game:GuessTheNumbr-v0'. Did you mean: game:GuessTheNumber-v0, game:GuessTheNumber-v0-hard, game:GuessTheNumber-v0-easy? (`gem-core list` shows every id)",
    ),
    (["serve", GUESS, "--max-sessions", "0"], "gem-core serve: error: argument --max-sessions: expected a number in 1..4096, got 0"),
    (["serve", GUESS, "--max-sessions", "5000"], "gem-core serve: error: argument --max-sessions: expected a number in 1..4096, got 5000"),
    (["serve", GUESS, "--idle-timeout", "0"], "gem-core serve: error: argument --idle-timeout: expected a number of seconds > 0, got 0"),
    (["serve", GUESS, "--idle-timeout", "soon"], "gem-core serve: error: argument --idle-timeout: expected a number of seconds, got 'soon'"),
    (["serve", GUESS, "--port", "70000"], "gem-core serve: error: argument --port: expected a number in 0..65535, got 70000"),
    (["serve", GUESS, "--env-kwargs", "[1]"], "gem-core: error: --env-kwargs: env kwargs must be a JSON object, got list"),
    (
        ["serve", GUESS, "--env-kwargs", '{"max_turn": 3}'],
        "gem-core: error: game:GuessTheNumber-v0 does not take 'max_turn'. Did you mean: max_turns? It accepts: max_number, max_turns, min_number.",
    ),
    (
        ["serve", GUESS, "--env-kwargs", '{"max_turns": 0}'],
        "gem-core: error: game:GuessTheNumber-v0: max_turns=0 is not allowed: expected an integer in 1..100000, or None (set per episode by the game)",
    ),
    (["serve", GUESS, "--tools", "shell"], "gem-core: error: serve: unknown env tool(s) ['shell']; known: python, search"),
    (["serve", GUESS, GUESS], "gem-core: error: serve: env_ids=['game:GuessTheNumber-v0', 'game:GuessTheNumber-v0'] is not allowed: expected distinct env ids"),
    (["serve", GUESS, "--host", "192.0.2.1", "--port", "0", "--insecure"], "gem-core: error: cannot listen on 192.0.2.1:0: Cannot assign requested address"),
    (
        ["serve", GUESS, "--host", "0.0.0.0", "--port", "0"],
        "gem-core: error: serve: 0.0.0.0 is reachable from other machines, and anyone who reaches the port plays (and runs code in) "
        "the served envs: give a token (--token, or the GEM_SERVE_TOKEN environment variable) or pass --insecure",
    ),
    (
        ["serve", GUESS, "--host", "0.0.0.0", "--port", "0", "--token", "short"],
        "gem-core: error: serve: a token is at least 16 printable characters without spaces (e.g. from: openssl rand -hex 24)",
    ),
    (["serve", GUESS, "--max-action-chars", "0"], "gem-core serve: error: argument --max-action-chars: expected a number in 1..16777216, got 0"),
    (["serve", GUESS, "--max-connections", "1"], "gem-core serve: error: argument --max-connections: expected a number in 2..1000000, got 1"),
    (["serve", GUESS, "--header-timeout", "-1"], "gem-core serve: error: argument --header-timeout: expected a number of seconds > 0, got -1"),
    (["serve", GUESS, "--body-timeout", "never"], "gem-core serve: error: argument --body-timeout: expected a number of seconds, got 'never'"),
    (
        ["serve", GUESS, "--allow-origin", "null"],
        "gem-core: error: serve: --allow-origin: 'null' is not a web origin: give it as a browser sends it, scheme://host[:port] (e.g. http://localhost:8888)",
    ),
    (
        ["serve", GUESS, "--allow-host", "envs.example:8000"],
        "gem-core: error: serve: --allow-host: 'envs.example:8000' is not a host name: give a DNS name without scheme or port (e.g. envs.example.org)",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), BAD, ids=[" ".join(a[1:])[:60] for a, _ in BAD])
def test_bad_invocations_are_one_line(argv, expected, capsys):
    code, err = run_main(argv, capsys)
    assert "Traceback" not in err
    assert code == 2, err
    lines = err.rstrip("\n").split("\n")
    assert lines[-1] == expected, err
    if ": error: argument" not in expected:
        assert len(lines) == 1, err


def test_a_port_in_use_is_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, err = run_main(["serve", GUESS, "--port", str(port)], capsys)
    assert (code, err) == (2, f"gem-core: error: cannot listen on 127.0.0.1:{port}: Address already in use\n")


def test_the_token_comes_from_the_environment_too(capsys, monkeypatch):
    monkeypatch.setenv("GEM_SERVE_TOKEN", "0123456789abcdef0123")  # the auth check passes: the bind is what fails
    code, err = run_main(["serve", GUESS, "--host", "192.0.2.1", "--port", "0"], capsys)
    assert (code, err) == (2, "gem-core: error: cannot listen on 192.0.2.1:0: Cannot assign requested address\n")


def test_at_a_low_fd_limit_silent_connections_neither_starve_clients_nor_flood_the_log():
    """Before: at the fd limit new clients timed out and the accept loop logged EMFILE in a tight loop (80 MB in
    10 s). Now the connection cap stays under the limit and a silent connection is closed after its deadline."""
    import resource

    def low_fds() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen(
        [*_script(), "serve", GUESS, "--port", "0", "--header-timeout", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=low_fds
    )
    silent: list[socket.socket] = []
    try:
        url = re.search(r"(http://127\.0\.0\.1:\d+)", proc.stdout.readline()).group(1)
        host, port = url.removeprefix("http://").split(":")
        for _ in range(400):  # more than the process may open
            try:
                silent.append(socket.create_connection((host, int(port)), timeout=30))
            except OSError:
                pass
        played = None
        for _ in range(60):  # hang guard: the kept ones are closed after 1 s, then a client gets in
            try:
                with GenericEnvClient(base_url=url).sync() as client:
                    played = record(client.reset(seed=2))
                break
            except Exception:
                time.sleep(0.5)
        assert played == play_local(GUESS, 2, [])[0]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        for sock in silent:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err
    assert len(err) < 5000, err[-2000:]  # a few rate-limited lines, not a flood (a burst may still meet EMFILE once: one line)
    assert "connection refused" in err and "slow client" in err


def test_allow_origin_and_allow_host_reach_the_server():
    """--allow-origin: that web origin's pages are served (others refused); --allow-host: that name is served."""
    proc = subprocess.Popen(
        [*_script(), "serve", GUESS, "--port", "0", "--allow-origin", "http://nb.example:8888", "--allow-host", "envs.example"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = re.search(r"(http://127\.0\.0\.1:\d+)", proc.stdout.readline()).group(1)
        ws = url.replace("http://", "ws://") + "/ws"
        with connect(ws, origin="http://nb.example:8888", open_timeout=30):  # allowed
            pass
        with pytest.raises(InvalidStatus):
            connect(ws, origin="http://evil.example", open_timeout=30)
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"GET /schema HTTP/1.1\r\nHost: envs.example:{port}\r\nConnection: close\r\n\r\n".encode())
            assert sock.recv(12) == b"HTTP/1.1 200"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err
