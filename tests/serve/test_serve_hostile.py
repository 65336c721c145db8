"""`gem-core serve` under hostile or careless clients: every read bounded, every session owned by its
connection, a token off loopback, and one clear line (to the client, and in the log) for each bad thing.

Each test is an attack that worked before the guard (issue 49): sessions made over HTTP MCP held every slot,
silent TCP connections stayed open forever, a JSON array dropped the session, and so on.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import threading
import time
from typing import Any

import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import gem_core
from gem_core.envs.games.guess_the_number import GuessTheNumber
from gem_core.errors import InvalidArgumentError
from gem_core.serve import serve
from gem_core.serve.guard import EventLog, ServeGuard
from gem_core.serve.server import EnvServer

GUESS = "game:GuessTheNumber-v0"
SLOW = "test:SlowGuess-v0"
TOKEN = "0123456789abcdef0123456789abcdef"


class SlowGuess(GuessTheNumber):
    """GuessTheNumber whose step takes 0.5 s: time for a client to leave mid-step."""

    def step(self, action: Any) -> Any:
        time.sleep(0.5)
        return super().step(action)


class VerySlowGuess(GuessTheNumber):
    """GuessTheNumber whose step takes 6 s: longer than an idle timeout, and than OpenEnv's reaper's 5 s tick."""

    def step(self, action: Any) -> Any:
        time.sleep(6)
        return super().step(action)


gem_core.register(SLOW, SlowGuess, override=True)
gem_core.register("test:VerySlowGuess-v0", VerySlowGuess, override=True)


def ws_url(server: EnvServer) -> str:
    return server.url().replace("http://", "ws://") + "/ws"


def ask(ws: Any, message: Any) -> dict[str, Any]:
    ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def wait_for(condition: Any, timeout: float = 30.0) -> bool:
    """Hang guard: poll ``condition`` until it holds or ``timeout`` (generous) passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# -- 2. the action size limit ----------------------------------------------------------------------
def test_an_oversized_action_is_one_line_and_the_session_is_kept():
    with serve(GUESS, max_action_chars=1000) as server:
        with GenericEnvClient(base_url=server.url()).sync() as client:
            client.reset(seed=3)
            first = client.step({"action": "\\boxed{1}"})
            with pytest.raises(RuntimeError, match=r"the action has 1001 characters; this server takes at most 1000 \(--max-action-chars\)"):
                client.step({"action": "<bash>" + "x" * 995})
            after = client.step({"action": "\\boxed{2}"})  # the same session, the same episode: turn 2
            assert first.observation["info"] != after.observation["info"]
            assert client.state()["step_count"] == 2
        assert server.events.counts["bad message"] == 1


# -- 3. sessions owned by their connection -----------------------------------------------------------
def _post_mcp(server: EnvServer, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    host, port = server.url().removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_http_mcp_cannot_make_hold_or_close_sessions():
    with serve(GUESS, max_sessions=3) as server:
        for _ in range(4):  # before: four of these held every slot until the server restarted
            status, body = _post_mcp(server, "openenv/session/create", {})
            assert status == 403 and "a session is made by a WebSocket (/ws) and ends with it" in body["detail"]
        assert server.open_envs == 0
        with GenericEnvClient(base_url=server.url()).sync() as one, GenericEnvClient(base_url=server.url()).sync() as two:
            one.reset(seed=1)
            two.reset(seed=2)
            status, _ = _post_mcp(server, "openenv/session/close", {"session_id": "anything"})
            assert status == 403
            with connect(ws_url(server), open_timeout=30) as ws:  # the same through a WebSocket's MCP message
                reply = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/close", "params": {"session_id": "x"}}})
                assert reply["type"] == "error" and "MCP messages are off" in reply["data"]["message"]
            assert one.step({"action": "\\boxed{3}"}).observation["info"] is not None  # both sessions still theirs
            assert two.step({"action": "\\boxed{3}"}).observation["info"] is not None
        with pytest.raises(InvalidStatus) as refused:  # no attaching to a session by id
            connect(ws_url(server) + "?session_id=0", open_timeout=30)
        assert refused.value.response.status_code == 403
        assert b"each connection (/ws) gets its own session" in refused.value.response.body
        assert wait_for(lambda: server.open_envs == 0)


def test_idle_websockets_are_closed_by_default_with_their_envs():
    assert EnvServer(GUESS).idle_timeout == 300.0  # before: None, sessions and sandboxes lived forever
    with serve(GUESS, max_sessions=2, idle_timeout=0.5) as server:
        sockets = [connect(ws_url(server), open_timeout=30).__enter__() for _ in range(2)]
        for seed, ws in enumerate(sockets):
            assert ask(ws, {"type": "reset", "data": {"seed": seed}})["type"] == "observation"
        for ws in sockets:  # the server says why, then closes
            assert "no message for 0.5 s" in json.loads(ws.recv(timeout=30))["data"]["message"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
        assert wait_for(lambda: server.open_envs == 0)
        with GenericEnvClient(base_url=server.url()).sync() as client:  # the slots are free
            assert client.reset(seed=0).done is False


def test_a_step_longer_than_the_idle_timeout_is_not_idle_time():
    """Idle is the time between a client's messages, not a step's own time (OpenEnv's reaper closed the env
    under a long step: the next request found it closed)."""
    with serve("test:VerySlowGuess-v0", idle_timeout=1) as server:
        with GenericEnvClient(base_url=server.url(), message_timeout_s=60).sync() as client:
            client.reset(seed=1)
            client.step({"action": "\\boxed{1}"})
            assert client.reset(seed=2).done is False  # the same session, its env still open
        assert server.events.counts["idle"] == 0


# -- 4. slow and silent connections, the connection cap, rate-limited log lines --------------------------
def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_silent_and_trickling_connections_are_closed_and_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="gem_core.serve")
    with serve(GUESS, header_timeout=0.5) as server:
        host, port = server.url().removeprefix("http://").split(":")
        silent = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
        trickling = socket.create_connection((host, int(port)), timeout=30)
        trickling.settimeout(0.2)
        closed = False
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 200:  # one byte every 0.2 s, forever
            try:
                trickling.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_by_server(trickling):
                closed = True
                break
        assert closed, "the trickling connection was never closed"
        for sock in silent:  # before: 400 of 400 still open after 70 s
            sock.settimeout(30)
            assert _closed_by_server(sock)
            sock.close()
        trickling.close()
        assert server.events.counts["slow client"] == 21
        lines = [r for r in caplog.records if "slow client" in r.getMessage()]
        assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]  # one line per 10 s, not one per connection
        with GenericEnvClient(base_url=server.url()).sync() as client:
            assert client.reset(seed=0).done is False


def test_a_refused_request_has_its_body_read_before_the_refusal():
    """ServeGuard reads a refused request's body (/mcp), bounded in time, before it answers 403: closed with the body
    unread, the server's socket sends a TCP reset, which can reach the client before the refusal and lose it (seen
    once in CI, through http.client, which sends the headers and the body apart). A body that never comes delays the
    refusal by the body deadline, no more."""

    def refused(chunks: list[bytes | None], body_timeout: float) -> list[str]:
        events: list[str] = []
        pending = list(chunks)

        async def receive() -> dict[str, Any]:
            chunk = pending.pop(0)
            if chunk is None:  # a body that never comes
                await asyncio.sleep(3600)
            events.append("receive")
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

        async def send(message: dict[str, Any]) -> None:
            events.append(message["type"])

        async def app(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("a refused request reached OpenEnv's app")

        guard = ServeGuard(app, events=EventLog(), token=None, max_action_chars=1000, idle_timeout=None, body_timeout=body_timeout)
        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "client": ("127.0.0.1", 1)}
        asyncio.run(asyncio.wait_for(guard(scope, receive, send), 30))  # hang guard
        return events

    assert refused([b'{"jsonrpc": ', b'"2.0"}'], body_timeout=30) == ["receive", "receive", "http.response.start", "http.response.body"]
    assert refused([None], body_timeout=0.2) == ["http.response.start", "http.response.body"]


def test_a_refused_request_whose_body_trickles_is_answered_at_the_body_deadline():
    with serve(GUESS, body_timeout=0.5) as server:
        host, port = server.url().removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        answer = b""
        while b"\r\n\r\n" not in answer:  # hang guard: the socket's 30 s timeout
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 403"), answer[:200]


def test_a_body_that_trickles_is_answered_408():
    with serve(GUESS, body_timeout=0.5) as server:
        host, port = server.url().removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        answer = b""
        while b"\r\n\r\n" not in answer:  # hang guard: the socket's 30 s timeout
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert server.events.counts["slow client"] == 1


def test_connections_past_the_cap_are_closed_at_once():
    with serve(GUESS, max_connections=8, header_timeout=60) as server:
        host, port = server.url().removeprefix("http://").split(":")
        socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
        for sock in socks:
            sock.settimeout(2)
        closed = sum(_closed_by_server(sock) for sock in socks)
        assert closed == 12  # 8 kept (they have 60 s for their headers), the 12 past the cap closed at once
        assert server.events.counts["connection refused"] == 12
        for sock in socks:
            sock.close()
        with GenericEnvClient(base_url=server.url()).sync() as client:  # the cap frees as connections close
            assert wait_for(lambda: _reset_ok(client))


def _reset_ok(client: Any) -> bool:
    try:
        return client.reset(seed=0).done is False
    except Exception:
        return False


# -- 5. a token off loopback --------------------------------------------------------------------------
def test_off_loopback_needs_a_token_or_insecure():
    with pytest.raises(InvalidArgumentError, match=r"serve: 0.0.0.0 is reachable from other machines.*give a token .* or pass --insecure"):
        EnvServer(GUESS, host="0.0.0.0")
    assert "NONE (--insecure)" in EnvServer(GUESS, host="0.0.0.0", insecure=True).security_line()
    assert "a token is required" in EnvServer(GUESS, host="0.0.0.0", token=TOKEN).security_line()


def test_a_token_is_checked_on_every_request():
    with serve(GUESS, token=TOKEN) as server:
        with pytest.raises(ConnectionError, match="401"):
            GenericEnvClient(base_url=server.url()).sync().reset(seed=0)
        with pytest.raises(ConnectionError, match="401"):
            GenericEnvClient(base_url=server.url(), headers={"Authorization": "Bearer " + "x" * len(TOKEN)}).sync().reset(seed=0)
        with GenericEnvClient(base_url=server.url(), headers={"Authorization": f"Bearer {TOKEN}"}).sync() as client:
            assert client.reset(seed=0).done is False
        host, port = server.url().removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/reset", "{}", {"Content-Type": "application/json"})
        assert conn.getresponse().status == 401
        conn.close()
        assert server.events.counts["unauthorized"] == 3
        assert wait_for(lambda: server.open_envs == 0)


# -- 6. clear errors, the session kept ----------------------------------------------------------------
def test_malformed_messages_get_one_line_and_keep_the_session():
    with serve(GUESS) as server, connect(ws_url(server), open_timeout=30, max_size=None) as ws:
        assert ask(ws, {"type": "reset", "data": {"seed": 4}})["type"] == "observation"
        cases = [
            ("[1, 2]", r'a message is a JSON object \{"type": .*got a JSON array'),  # before: 'list' object has no attribute 'get'
            ('"step"', r"got a JSON string"),
            ('{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}", r"a number in the message has 5000 digits; at most 64"),
            ("[" * 100_000, r"nested too deeply"),
            (b"\x00binary", r"send text frames"),
        ]
        for message, expected in cases:
            reply = ask(ws, message)
            assert reply["type"] == "error", message[:40]
            assert __import__("re").search(expected, reply["data"]["message"]), reply
        step = ask(ws, {"type": "step", "data": {"action": "\\boxed{5}"}})  # the same session: the episode goes on
        assert step["type"] == "observation"
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 1
        assert server.events.counts["bad message"] == len(cases)


def test_http_bodies_with_huge_numbers_or_deep_nesting_are_one_line():
    with serve(GUESS) as server:
        host, port = server.url().removeprefix("http://").split(":")
        for body, expected in [('{"seed": ' + "9" * 5000 + "}", "a number in the message has 5000 digits"), ("[" * 100_000, "nested too deeply")]:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", "/reset", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert (response.status, expected in json.loads(response.read())["detail"]) == (400, True)
            conn.close()


def test_a_huge_http_body_is_refused_before_it_is_read():
    with serve(GUESS, max_action_chars=1000) as server:
        host, port = server.url().removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("POST", "/step")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(64 * 1024 * 1024))  # before: read whole
        conn.endheaders(b'{"action": {"action": "')
        response = conn.getresponse()
        assert response.status == 413
        assert "this server takes at most" in json.loads(response.read())["detail"]
        conn.close()
        assert server.events.counts["body too large"] == 1


def test_a_client_leaving_mid_step_is_one_log_line_not_a_traceback(caplog):
    caplog.set_level(logging.INFO)
    with serve(SLOW) as server:
        ws = connect(ws_url(server), open_timeout=30).__enter__()
        assert ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"action": "\\boxed{2}"}}))
        ws.socket.shutdown(socket.SHUT_RDWR)  # gone before the 0.5 s step answers
        ws.socket.close()
        assert wait_for(lambda: server.open_envs == 0)
        assert wait_for(lambda: server.events.counts["client gone"] == 1)
    assert not [r for r in caplog.records if r.exc_info or "Exception in ASGI application" in r.getMessage()]
    assert len([r for r in caplog.records if "client gone" in r.getMessage()]) == 1


# -- 7. what held ---------------------------------------------------------------------------------------
def test_a_frame_over_16_mib_is_closed_with_1009():
    with serve(GUESS) as server, connect(ws_url(server), open_timeout=30, max_size=None) as ws:
        ws.send("x" * (16 * 1024 * 1024 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        assert wait_for(lambda: server.open_envs == 0)


def test_many_honest_clients_beside_hostile_ones():
    """32 clients x 20 steps while silent sockets and bad messages arrive: every honest step answered."""
    with serve(GUESS, max_sessions=40, header_timeout=0.5) as server:
        host, port = server.url().removeprefix("http://").split(":")
        silent = [socket.create_connection((host, int(port)), timeout=30) for _ in range(30)]
        errors: list[BaseException] = []

        def honest(seed: int) -> None:
            try:
                with GenericEnvClient(base_url=server.url()).sync() as client:
                    client.reset(seed=seed)
                    for k in range(20):
                        result = client.step({"action": f"\\boxed{{{k % 20 + 1}}}"})
                        if result.done:
                            client.reset(seed=seed + 1000 * k)
            except BaseException as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)

        threads = [threading.Thread(target=honest, args=(seed,)) for seed in range(32)]
        for thread in threads:
            thread.start()
        with connect(ws_url(server), open_timeout=30) as bad:
            for _ in range(50):
                assert ask(bad, "[1]")["type"] == "error"
        for thread in threads:
            thread.join(120)
        assert not errors, errors[:3]
        for sock in silent:
            sock.close()
        assert wait_for(lambda: server.open_envs == 0)


def test_an_openenv_id_sends_the_token_from_the_environment(monkeypatch):
    with serve(GUESS, token=TOKEN) as server:
        monkeypatch.delenv("GEM_SERVE_TOKEN", raising=False)
        with pytest.raises(gem_core.errors.GemError, match="cannot read the server.s /schema: Unauthorized"):
            gem_core.make(f"openenv:{server.url()}")
        monkeypatch.setenv("GEM_SERVE_TOKEN", TOKEN)
        env = gem_core.make(f"openenv:{server.url()}")
        try:
            obs, _ = env.reset(seed=0)
            assert isinstance(obs, str) and obs
        finally:
            env.close()
        assert wait_for(lambda: server.open_envs == 0)
