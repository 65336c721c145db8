"""What stands between OpenEnv's app and a hostile or careless client: bounds on every read, and one line each.

* :class:`ServeGuard` (an ASGI app wrapped around OpenEnv's ``create_app``): web pages kept out (a browser's
  Origin unless allowed; without a token, a Host that is not this server's, as DNS rebinding sends), the token,
  a bounded HTTP body (size and time), the HTTP MCP session API turned off (sessions are made by a WebSocket
  and end with it), WebSocket messages checked before OpenEnv reads them (size, JSON object, numbers, the
  action's length: a clear error and the session kept), an idle WebSocket closed, a client gone mid-step one
  log line.
* :func:`guarded_http_protocol` (in :mod:`gem_core.serve.connections`, importable from here): the bounds
  below the app, on uvicorn's connections (a deadline for the headers, a cap on open connections, a lingering
  close).
* :class:`EventLog` and :class:`RepeatFilter` (in :mod:`gem_core.serve.events`, importable from here): one log
  line per kind of event, at most one per interval, with a count of the rest.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from gem_core.serve.connections import guarded_http_protocol
from gem_core.serve.events import REFUSED_OVER_HTTP, EventLog, RepeatFilter

__all__ = [
    "CLOSE_WAIT_S",
    "JSON_BYTES_PER_CHAR",
    "MAX_NUMBER_DIGITS",
    "MESSAGE_OVERHEAD_BYTES",
    "EventLog",
    "RepeatFilter",
    "ServeGuard",
    "guarded_http_protocol",
    "normalize_host",
    "normalize_origin",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The longest integer (in digits) a message may hold: a seed is far shorter; Python refuses over 4300.
MAX_NUMBER_DIGITS = 64
#: The most bytes one character of an action takes in a message's JSON: 12 for a character outside the BMP that the
#: sender escapes as a surrogate pair (``\ud83d\ude00``: ``json.dumps``, and so OpenEnv's client, escape everything
#: outside ASCII), 6 for any other escaped one, at most 4 unescaped in UTF-8.
JSON_BYTES_PER_CHAR = 12
#: Room for the message around the action (its type, field names, reset's seed and options).
MESSAGE_OVERHEAD_BYTES = 65_536
#: How long a WebSocket that the server closed waits for the client's close frame.
CLOSE_WAIT_S = 5.0


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


def _error_frame(message: str, code: str) -> str:
    """A WebSocket error reply in OpenEnv's own shape (its client raises it as ``Server error: MESSAGE``)."""
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise _TooManyDigits(len(text.lstrip("-")))
    return int(text)


class _TooManyDigits(ValueError):
    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def normalize_origin(origin: str) -> str:
    """A web origin as browsers send it (``scheme://host[:port]``, lowercase, no path), for ``--allow-origin``; a
    ValueError says what is wrong."""
    value = origin.strip().lower().rstrip("/") if isinstance(origin, str) else ""
    scheme, sep, host = value.partition("://")
    if not sep or not scheme.isascii() or not scheme.isalpha() or not host or any(c in host for c in "/?#@ \t"):
        raise ValueError(f"{origin!r} is not a web origin: give it as a browser sends it, scheme://host[:port] (e.g. http://localhost:8888)")
    return value


def normalize_host(name: str) -> str:
    """A host name for ``--allow-host`` (a DNS name, no port), lowercase; a ValueError says what is wrong."""
    value = name.strip().lower().rstrip(".") if isinstance(name, str) else ""
    if not value or not all(c.isascii() and (c.isalnum() or c in "-.") for c in value):
        raise ValueError(f"{name!r} is not a host name: give a DNS name without scheme or port (e.g. envs.example.org)")
    return value


def _host_name(host: str) -> str:
    """The name in a Host header (``name``, ``name:port``, ``[v6]:port``), lowercase, without the port."""
    value = host.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    return (name if sep and port.isdigit() else value).rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _shown(value: bytes) -> str:
    """A header value as a log line and an answer show it: quoted, at most 100 characters."""
    return repr(value.decode("latin-1")[:100])


class ServeGuard:
    """The ASGI app uvicorn runs: checks each request and WebSocket message, then hands it to ``app`` (OpenEnv's).

    ``token``: required on every request but ``GET /health``, as ``Authorization: Bearer TOKEN``.
    ``allow_origins``: the web origins whose pages may use the server; a request from any other (a browser sends
    ``Origin``; OpenEnv's client and gem-core's send none) is refused. ``allow_hosts``: the DNS names clients may
    reach the server by besides ``localhost`` (IP addresses always pass): without a token, a request whose Host
    names another is refused, which stops DNS rebinding (a page whose own name was made to resolve here).
    ``max_action_chars``: the longest action a step takes (a WebSocket message or an HTTP body is bounded by the
    longest JSON of such an action: ``max_message_bytes``).
    ``idle_timeout``: a WebSocket with no message for this long is closed (its session and env with it);
    ``None``: never. ``body_timeout``: the seconds an HTTP body has to arrive whole.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        events: EventLog,
        token: str | None,
        max_action_chars: int,
        idle_timeout: float | None,
        body_timeout: float,
        allow_origins: Iterable[str] = (),
        allow_hosts: Iterable[str] = (),
    ):
        self.app = app
        self.events = events
        self._token = None if token is None else token.encode()
        self.allow_origins = frozenset(normalize_origin(o) for o in allow_origins)
        self.allow_hosts = frozenset({"localhost"} | {normalize_host(h) for h in allow_hosts})
        self.max_action_chars = max_action_chars
        #: The longest WebSocket message (uvicorn's frame limit: a longer one is closed with 1009 as its header
        #: arrives) and HTTP body (413): the JSON of one maximal action, however its sender escapes it, and room.
        self.max_message_bytes = JSON_BYTES_PER_CHAR * max_action_chars + MESSAGE_OVERHEAD_BYTES
        self.max_body_bytes = self.max_message_bytes
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:  # lifespan: the server's loop starts here
            asyncio.get_running_loop().set_exception_handler(self._loop_exception)
            await self.app(scope, receive, send)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's own errors as one line each, rate-limited (asyncio's default prints a traceback; out of
        file descriptors, its accept loop retries every second)."""
        error = context.get("exception")
        detail = context.get("message", "error in the event loop").split("\n", 1)[0]
        if error is not None:
            detail += f": {type(error).__name__}: {error}"
        self.events.note("server", detail)

    # -- checks common to both ---------------------------------------------------------------------
    def _web_page_refusal(self, scope: Scope) -> tuple[str, str] | None:
        """(log detail, answer) when a request comes from a web page the server does not serve: a browser's Origin not
        allowed, or (without a token) a Host that is not a name of this server. None otherwise."""
        for name, value in scope.get("headers", ()):
            if name == b"origin" and value.decode("latin-1").strip().lower().rstrip("/") not in self.allow_origins:
                try:
                    allow = f" (gem-core serve --allow-origin {normalize_origin(value.decode('latin-1'))} allows it)"
                except ValueError:
                    allow = ""
                return f"Origin {_shown(value)} (not in --allow-origin)", f"web pages may not use this server: Origin {_shown(value)} is not allowed{allow}"
            # with a token a web page cannot get in anyway (it does not have the token), and the server may be reached
            # by any name (a cluster's service name): the Host is checked only without one
            if name == b"host" and self._token is None:
                host = _host_name(value.decode("latin-1"))
                if host not in self.allow_hosts and not _is_ip(host):
                    allow = f"gem-core serve --allow-host {host} allows it" if host else "give the address clients use"
                    return (
                        f"Host {_shown(value)} (not a name of this server: --allow-host)",
                        f"Host {_shown(value)} is not a name of this server (a web page that reaches it by DNS rebinding sends its own): {allow}",
                    )
        return None

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, one line) when the request is refused before OpenEnv sees it; None when it may go on."""
        path = scope.get("path", "")
        health = scope["type"] == "http" and path.endswith("/health")
        web_page = None if health else self._web_page_refusal(scope)
        if web_page is not None:
            detail, line = web_page
            self.events.note("refused", f"{_client(scope)} {path}: {detail}")
            return 403, line
        if self._token is not None and not health:
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self._token):
                self.events.note("unauthorized", f"{_client(scope)} {path}: no valid token")
                return 401, "this server needs a token: send the header 'Authorization: Bearer TOKEN' (GenericEnvClient(base_url, headers={...}))"
        if path.endswith("/mcp"):
            self.events.note("refused", f"{_client(scope)} {path}: the MCP endpoints are off")
            return 403, (
                "gem-core serve turns off OpenEnv's MCP endpoints (/mcp): a session is made by a WebSocket (/ws) and "
                "ends with it, so no client can hold or close another's; play over /ws"
            )
        if scope["type"] == "websocket" and "session_id" in parse_qs(scope.get("query_string", b"").decode("latin-1")):
            self.events.note("refused", f"{_client(scope)} {path}: asked to attach to a session by id")
            return 403, "a WebSocket cannot attach to a session by id here: each connection (/ws) gets its own session"
        return None

    # -- HTTP --------------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self._refusal(scope)
        if refused is not None:
            await self._drain(receive)
            await _reply(send, *refused)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            self.events.note("body too large", f"{_client(scope)} {scope['path']}: {int(length)} bytes")
            await _reply(send, 413, f"the request body has {int(length)} bytes; this server takes at most {self.max_body_bytes}")
            return
        body = bytearray()
        deadline = time.monotonic() + self.body_timeout
        while True:  # the whole body first, bounded in size and time, then OpenEnv reads it from memory
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                self.events.note("slow client", f"{_client(scope)} {scope['path']}: the body did not arrive within {self.body_timeout:g} s")
                await _reply(send, 408, f"the request body did not arrive within {self.body_timeout:g} s")
                return
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                self.events.note("body too large", f"{_client(scope)} {scope['path']}: over {self.max_body_bytes} bytes")
                await _reply(send, 413, f"the request body is over {self.max_body_bytes} bytes, the most this server takes")
                return
            if not message.get("more_body", False):
                break
        problem = _json_problem(bytes(body)) if body else None
        if problem is not None:
            self.events.note("bad message", f"{_client(scope)} {scope['path']}: {problem}")
            await _reply(send, 400, problem)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            try:
                await send(message)
            except OSError:  # the client went away before the answer: nothing to tell it
                self.events.note("client gone", f"{_client(scope)} {scope['path']}: left before the response")

        try:
            await self.app(scope, replay, tracked_send)
        except Exception as err:  # one line in the log, one line to the client; never an ASGI traceback
            self.events.note("error", f"{scope['method']} {scope['path']}: {type(err).__name__}: {err}")
            if not started:
                await _reply(send, 500, f"{type(err).__name__}: {err}")

    async def _drain(self, receive: Receive) -> None:
        """Read a refused request's body, unkept, bounded as any body is (size and time): a body left unread makes the
        server's close a reset, which can reach the client before the refusal and lose it."""
        read = 0
        deadline = time.monotonic() + self.body_timeout
        while read <= self.max_body_bytes:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                return
            read += len(message.get("body", b""))
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return

    # -- WebSocket ---------------------------------------------------------------------------------
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self._refusal(scope)
        if refused is not None:
            await receive()  # websocket.connect
            status, line = refused
            if "websocket.http.response" in scope.get("extensions", {}):  # the reason reaches the client as the HTTP answer
                REFUSED_OVER_HTTP.set(True)
                await send({"type": "websocket.http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "websocket.http.response.body", "body": json.dumps({"detail": line}).encode()})
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": line[:120]})
            return
        connection = _WebSocketGuard(self, scope, receive, send)
        try:
            await self.app(scope, connection.receive, connection.send)
        except Exception as err:
            self.events.note("error", f"WebSocket {scope['path']}: {type(err).__name__}: {err}")
        finally:
            connection.drop()

    def check_message(self, text: str) -> str | None:
        """Why a WebSocket message is refused (one line), or None when OpenEnv may read it."""
        if len(text) > self.max_message_bytes:  # uvicorn's frame limit comes first; this bounds the guard on its own
            return (
                f"the message has {len(text)} characters; this server takes at most {self.max_message_bytes} "
                f"(an action of at most {self.max_action_chars}: --max-action-chars)"
            )
        try:
            message = json.loads(text, parse_int=_bounded_int)
        except (_TooManyDigits, RecursionError) as err:
            return _parse_problem(err)
        except ValueError as err:
            return f"the message is not JSON: {err}"
        if not isinstance(message, dict):
            return f'a message is a JSON object {{"type": "reset"|"step"|"state"|"close", "data": {{...}}}}, got a JSON {_json_kind(message)}'
        kind = message.get("type")
        if kind == "mcp":
            return "MCP messages are off on gem-core serve (its envs take text actions): send reset, step, state or close"
        data = message.get("data")
        if kind == "step" and isinstance(data, dict) and isinstance(data.get("action"), str) and len(data["action"]) > self.max_action_chars:
            return f"the action has {len(data['action'])} characters; this server takes at most {self.max_action_chars} (--max-action-chars)"
        return None


def _parse_problem(err: BaseException) -> str:
    if isinstance(err, _TooManyDigits):
        return f"a number in the message has {err.digits} digits; at most {MAX_NUMBER_DIGITS} are taken (a seed is an integer from 0)"
    return "the message is nested too deeply to be a message"


def _json_problem(body: bytes) -> str | None:
    """Why an HTTP JSON body is refused before FastAPI parses it (a number too long for Python's int parser,
    nesting deeper than its recursion limit), or None (other bad JSON is FastAPI's to answer)."""
    try:
        json.loads(body, parse_int=_bounded_int)
    except (_TooManyDigits, RecursionError) as err:
        return _parse_problem(err)
    except ValueError:
        return None
    return None


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


async def _reply(send: Send, status: int, line: str) -> None:
    body = json.dumps({"detail": line}).encode()
    try:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
    except OSError:
        pass


class _WebSocketGuard:
    """One WebSocket connection's receive and send, as OpenEnv's endpoint sees them."""

    def __init__(self, guard: ServeGuard, scope: Scope, receive: Receive, send: Send):
        self.guard = guard
        self.scope = scope
        self._receive = receive
        self._send = send
        self._pending: asyncio.Future[Message] | None = None
        self._closed_by_us = False
        self._gone = False

    async def send(self, message: Message) -> None:
        if self._gone or self._closed_by_us:
            return  # the answer to a client that left, or OpenEnv's close after ours: nowhere to go
        try:
            await self._send(message)
        except OSError:  # uvicorn's ClientDisconnected: the client left mid-step; its session ends at the next read
            self._gone = True
            self.guard.events.note("client gone", f"{_client(self.scope)} left before its answer was sent")

    async def receive(self) -> Message:
        while True:
            message = await self._next()
            if message["type"] != "websocket.receive":
                return message
            text = message.get("text")
            if text is None:
                problem = "send text frames (JSON messages), not binary ones"
            else:
                problem = self.guard.check_message(text)
            if problem is None:
                return message
            self.guard.events.note("bad message", f"{_client(self.scope)}: {problem}")
            await self.send({"type": "websocket.send", "text": _error_frame(problem, "VALIDATION_ERROR")})
            if self._gone:
                return {"type": "websocket.disconnect", "code": 1006}

    async def _next(self) -> Message:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        try:
            done, _ = await asyncio.wait({self._pending}, timeout=self.guard.idle_timeout)
        except asyncio.CancelledError:
            self.drop()
            raise
        if not done:
            timeout = self.guard.idle_timeout
            self.guard.events.note("idle", f"closed {_client(self.scope)}: no message for {timeout:g} s (--idle-timeout)")
            await self.send(
                {"type": "websocket.send", "text": _error_frame(f"closing: no message for {timeout:g} s, the server's idle timeout", "SESSION_ERROR")}
            )
            await self.send({"type": "websocket.close", "code": 1001, "reason": "idle timeout"})
            self._closed_by_us = True
            await asyncio.wait({self._pending}, timeout=CLOSE_WAIT_S)
            self.drop()
            return {"type": "websocket.disconnect", "code": 1001}
        message = self._pending.result()
        self._pending = None
        return message

    def drop(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        self._pending = None
