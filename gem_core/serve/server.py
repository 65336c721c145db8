"""Serve gem-core env ids over OpenEnv's protocol with OpenEnv's own server (``create_app``), under uvicorn.

    with serve("game:GuessTheNumber-v0", max_sessions=64, idle_timeout=300) as server:
        client = GenericEnvClient(base_url=server.url()).sync()   # openenv's own client
        ...

Each WebSocket session (``/ws``) gets its own env; ``reset`` takes ``seed`` and ``options``. The session
count is bounded (``max_sessions``, per id: OpenEnv answers the next one ``CAPACITY_REACHED``), a WebSocket
with no message for ``idle_timeout`` seconds is closed with its session, and :meth:`EnvServer.stop` ends every
session and closes every env. Several ids are served side by side, each under ``/<env id>`` (its base URL:
:meth:`EnvServer.url`).

In front of OpenEnv's app stands :class:`~gem_core.serve.guard.ServeGuard` (web pages kept out, the token,
bounded reads, the MCP session API off, clear errors) and uvicorn runs a guarded h11 protocol (a deadline for
each request's headers, a cap on open connections, a lingering close after an early answer), with WebSocket
compression off and a frame limit of one maximal action's JSON: docs/openenv.md's threat model says what each
bounds.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import resource
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

try:  # without the openenv extra: one line naming it, not a ModuleNotFoundError from inside an import
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import ConcurrencyConfig, create_app
except ImportError:
    from gem_core.serve import require_openenv

    require_openenv()
    raise

from gem_core.errors import GemError, InvalidArgumentError
from gem_core.params import Param, invalid
from gem_core.registry import check_kwargs, spec
from gem_core.serve import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_SESSIONS,
    MAX_SESSIONS_LIMIT,
)
from gem_core.serve.environment import GemAction, GemEnvironment, GemObservation, GemState
from gem_core.serve.guard import EventLog, RepeatFilter, ServeGuard, guarded_http_protocol, normalize_host, normalize_origin
from gem_core.tasks import make_task_env
from gem_core.tools.factory import parse_tools

_MAX_SESSIONS = Param(int, low=1, high=MAX_SESSIONS_LIMIT)
_IDLE_TIMEOUT = Param(float, above=0, none="sessions never time out")
_PORT = Param(int, low=0, high=65535)
_MAX_ACTION_CHARS = Param(int, low=1, high=16 * 1024 * 1024)
_MAX_CONNECTIONS = Param(int, low=2, high=1_000_000)
_READ_TIMEOUT = Param(float, above=0)
#: WebSocket pings: a peer that answers none within the timeout is closed (uvicorn's defaults, pinned).
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0
#: File descriptors kept free of connections for the envs (sandboxes, pipes) and the server itself.
_FD_RESERVE = 128
_LOGGERS_FILTERED = ("uvicorn.error", "asyncio")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: How long ``stop`` lets sessions end before uvicorn cancels them.
GRACEFUL_SHUTDOWN_S = 5.0


class ServeError(GemError, RuntimeError):
    """The server could not start (the port is taken, the address is not this machine's, an env fails to build)."""


class EnvServer:
    """gem-core env ids served over OpenEnv's protocol, in a background thread. :func:`serve` starts one.

    ``envs_built`` / ``envs_closed`` count the session envs made and released (each closed once);
    ``open_envs`` is how many are alive now.
    """

    def __init__(
        self,
        env_ids: str | Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        env_kwargs: Mapping[str, Any] | None = None,
        tools: str | Sequence[str] | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        token: str | None = None,
        insecure: bool = False,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        allow_origins: Sequence[str] = (),
        allow_hosts: Sequence[str] = (),
    ):
        ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
        if not ids or not all(isinstance(i, str) for i in ids):
            raise invalid("env_ids", env_ids, "an env id or a non-empty list of env ids", "serve")
        if len(set(ids)) != len(ids):
            raise invalid("env_ids", ids, "distinct env ids", "serve")
        _MAX_SESSIONS.check("max_sessions", max_sessions, "serve")
        _IDLE_TIMEOUT.check("idle_timeout", idle_timeout, "serve")
        _PORT.check("port", port, "serve")
        _MAX_ACTION_CHARS.check("max_action_chars", max_action_chars, "serve")
        _MAX_CONNECTIONS.check("max_connections", max_connections, "serve")
        _READ_TIMEOUT.check("header_timeout", header_timeout, "serve")
        _READ_TIMEOUT.check("body_timeout", body_timeout, "serve")
        if not isinstance(host, str) or not host:
            raise invalid("host", host, "an address of this machine, e.g. 127.0.0.1", "serve", wrong_type=True)
        if token is not None and (not isinstance(token, str) or len(token) < 16 or not token.isprintable() or " " in token):
            raise InvalidArgumentError(
                "serve: a token is at least 16 printable characters without spaces (e.g. from: openssl rand -hex 24)", name="token", value="(hidden)"
            )
        if not is_loopback(host) and token is None and not insecure:
            raise InvalidArgumentError(
                f"serve: {host} is reachable from other machines, and anyone who reaches the port plays (and runs code in) "
                "the served envs: give a token (--token, or the GEM_SERVE_TOKEN environment variable) or pass --insecure",
                name="host",
                value=host,
            )
        self.allow_origins = _checked_names("allow_origins", allow_origins, normalize_origin)
        self.allow_hosts = _checked_names("allow_hosts", allow_hosts, normalize_host)
        self.token = token
        self.insecure = bool(insecure)
        self.max_action_chars = int(max_action_chars)
        self.header_timeout = float(header_timeout)
        self.body_timeout = float(body_timeout)
        soft_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        fd_room = max(16, soft_fds - _FD_RESERVE) if soft_fds != resource.RLIM_INFINITY else max_connections
        #: Open connections kept at most: ``max_connections``, or fewer when the fd limit is lower.
        self.max_connections = min(int(max_connections), fd_room)
        #: What the guard refused or closed, by kind (the log has one line per kind per 10 s).
        self.events = EventLog()
        self._log_filter = RepeatFilter()
        if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
            raise invalid("env_kwargs", env_kwargs, "a mapping of make() kwargs", "serve", wrong_type=True)
        self.env_kwargs = dict(env_kwargs or {})
        try:
            self.tools = parse_tools(tools)
        except ValueError as err:
            raise InvalidArgumentError(f"serve: {err}", name="tools", value=tools) from None
        for env_id in ids:  # unknown ids and bad kwargs fail here, one line each, before anything is built
            check_kwargs(spec(env_id), self.env_kwargs)
        self.env_ids = ids
        self.host, self.port = host, port
        self.max_sessions = int(max_sessions)
        self.idle_timeout = None if idle_timeout is None else float(idle_timeout)
        self.envs_built = 0
        self.envs_closed = 0
        self._live: set[GemEnvironment] = set()
        self._count_lock = threading.Lock()
        self._stopping = False
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        # one env of each id is built (and closed) now, so that an env that cannot be built fails here, in one line
        # (OpenEnv's create_app builds one too, to check that sessions may run side by side)
        for env_id in self.env_ids:
            try:
                make_task_env(env_id, self.env_kwargs, self.tools).close()
            except GemError:
                raise
            except Exception as err:
                raise ServeError(f"{env_id}: the env cannot be built: {type(err).__name__}: {err}") from None
        self.app = self._build_app()

    # -- the app ---------------------------------------------------------------------------------
    def _session_env(self, env_id: str) -> GemEnvironment:
        """OpenEnv's factory: a new session's env (counted, so that ``stop`` can check every one was closed)."""
        env = GemEnvironment(
            functools.partial(make_task_env, env_id, self.env_kwargs, self.tools),
            env_id,
            idle_timeout=self.idle_timeout,
            on_close=self._closed,
        )
        with self._count_lock:
            env.stopping = self._stopping
            self.envs_built += 1
            self._live.add(env)
        return env

    def _closed(self, env: GemEnvironment) -> None:
        with self._count_lock:
            self.envs_closed += 1
            self._live.discard(env)

    def _openenv_app(self, env_id: str) -> FastAPI:
        app = create_app(
            functools.partial(self._session_env, env_id),
            GemAction,
            GemObservation,
            env_name=env_id,
            # no OpenEnv reaper: it counts a long step as idle time and closes the env under it; the guard closes a
            # WebSocket idle between messages, and OpenEnv then ends its session (no session outlives its connection)
            concurrency_config=ConcurrencyConfig(max_concurrent_envs=self.max_sessions, session_timeout=None),
            state_cls=GemState,
        )

        async def gem_error(_: Request, exc: Exception) -> JSONResponse:
            # OpenEnv's stateless HTTP /reset and /step raise what the env raises: answer it as bad input
            return JSONResponse(status_code=400, content={"detail": str(exc)})

        app.add_exception_handler(GemError, gem_error)
        return app

    def _build_app(self) -> ServeGuard:
        return ServeGuard(
            self._openenv_apps(),
            events=self.events,
            token=self.token,
            max_action_chars=self.max_action_chars,
            idle_timeout=self.idle_timeout,
            body_timeout=self.body_timeout,
            allow_origins=self.allow_origins,
            allow_hosts=self.allow_hosts,
        )

    def _openenv_apps(self) -> FastAPI:
        apps = {env_id: self._openenv_app(env_id) for env_id in self.env_ids}
        if len(apps) == 1:
            return next(iter(apps.values()))

        @asynccontextmanager
        async def lifespan(_: FastAPI) -> Any:  # a mounted app's startup/shutdown (OpenEnv's reaper) is not run by Starlette
            async with AsyncExitStack() as stack:
                for sub in apps.values():
                    await stack.enter_async_context(sub.router.lifespan_context(sub))
                yield

        root = FastAPI(title="gem-core envs over OpenEnv", lifespan=lifespan)
        for env_id, sub in apps.items():
            root.mount("/" + env_id, sub)

        @root.get("/")
        async def index() -> dict[str, Any]:
            return {"envs": {env_id: "/" + env_id for env_id in apps}}

        return root

    # -- running ---------------------------------------------------------------------------------
    def url(self, env_id: str | None = None) -> str:
        """The base URL an OpenEnv client takes for ``env_id`` (the only id when one is served)."""
        if self._address is None:
            raise ServeError("the server was never started (start() it first)")
        host, port = self._address
        base = f"http://{host}:{port}"
        if env_id is None:
            if len(self.env_ids) != 1:
                raise invalid("env_id", env_id, f"one of {', '.join(self.env_ids)}", "EnvServer.url")
            env_id = self.env_ids[0]
        if env_id not in self.env_ids:
            raise invalid("env_id", env_id, f"one of {', '.join(self.env_ids)}", "EnvServer.url")
        return base if len(self.env_ids) == 1 else f"{base}/{env_id}"

    @property
    def open_envs(self) -> int:
        with self._count_lock:
            return len(self._live)

    def start(self, timeout: float = 30.0) -> EnvServer:
        """Bind the port and serve in a background thread; returns once the server accepts connections."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise ServeError(f"cannot listen on {self.host}:{self.port}: {err.strerror or err}") from None
        sock.listen(2048)
        sock.setblocking(False)
        self._socket = sock
        self._address = sock.getsockname()[:2]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            backlog=2048,
            http=guarded_http_protocol(
                header_timeout=self.header_timeout, max_connections=self.max_connections, events=self.events, linger_timeout=self.body_timeout
            ),
            ws="websockets-sansio",
            # a longer message is closed with 1009 as its frame's header arrives, before it is read
            ws_max_size=self.app.max_message_bytes,
            # no per-message deflate: with it a frame of a few KiB inflated to the whole limit before any check (issue
            # 63: 64 such frames took the server from 169 MB to 3.3 GB, kept after they closed); without it a message
            # costs its own size on the wire. Text actions on a local link gain little from compression.
            ws_per_message_deflate=False,
            ws_ping_interval=WS_PING_INTERVAL_S,
            ws_ping_timeout=WS_PING_TIMEOUT_S,
            limit_concurrency=self.max_connections,
            timeout_keep_alive=5,
            h11_max_incomplete_event_size=16 * 1024,
        )
        for name in _LOGGERS_FILTERED:  # uvicorn's and asyncio's own warnings: one line per kind per 10 s
            logging.getLogger(name).addFilter(self._log_filter)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="gem-core-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServeError(f"the server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """End every session, close every env, stop the server. Safe to call twice."""
        with self._count_lock:
            self._stopping = True
            for env in self._live:
                env.stopping = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACEFUL_SHUTDOWN_S + 10)
            self._thread = None
        with self._count_lock:
            leftover = list(self._live)
        for env in leftover:  # sessions uvicorn cancelled before OpenEnv's cleanup ran
            env.close()
        if self._socket is not None:
            self._socket.close()
        for name in _LOGGERS_FILTERED:
            logging.getLogger(name).removeFilter(self._log_filter)

    def security_line(self) -> str:
        """One line saying who may use the server: what ``gem-core serve`` prints at start."""
        where = f"{self.host} (this machine only)" if is_loopback(self.host) else f"{self.host} (reachable from other machines)"
        if self.token is not None:
            return f"auth: a token is required on {where}: clients send the header 'Authorization: Bearer TOKEN'"
        if is_loopback(self.host):
            return f"auth: none, listening on {where}; off loopback a token (--token or GEM_SERVE_TOKEN) is required"
        return f"auth: NONE (--insecure) on {where}: anyone who reaches the port plays the envs and runs what they run"

    def run_forever(self) -> None:
        """Serve until interrupted (Ctrl-C), then stop cleanly: ``gem-core serve``."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        finally:
            self.stop()

    def __enter__(self) -> EnvServer:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _checked_names(name: str, values: Sequence[str], normalize: Any) -> tuple[str, ...]:
    """``allow_origins`` / ``allow_hosts`` normalized, or one line saying which is wrong."""
    if isinstance(values, str) or not isinstance(values, (list, tuple, set, frozenset)):
        raise invalid(name, values, "a list of names", "serve", wrong_type=True)
    try:
        return tuple(normalize(value) for value in values)
    except ValueError as err:
        flag = "--" + name.removesuffix("s").replace("_", "-")
        raise InvalidArgumentError(f"serve: {flag}: {err}", name=name, value=values) from None


def serve(env_ids: str | Sequence[str], **kwargs: Any) -> EnvServer:
    """Serve ``env_ids`` over OpenEnv's protocol (a started :class:`EnvServer`; use it as a context manager
    or call ``stop()``). ``kwargs``: ``host``, ``port`` (0: a free one), ``env_kwargs``, ``tools``,
    ``max_sessions`` (per id), ``idle_timeout`` (seconds; None: never), ``token`` (needed off loopback unless
    ``insecure``), ``max_action_chars``, ``max_connections``, ``header_timeout``, ``body_timeout``,
    ``allow_origins`` (web origins whose pages may use it), ``allow_hosts`` (DNS names it may be reached by
    besides localhost, checked without a token)."""
    return EnvServer(env_ids, **kwargs).start()


__all__ = ["DEFAULT_MAX_SESSIONS", "EnvServer", "ServeError", "serve"]
