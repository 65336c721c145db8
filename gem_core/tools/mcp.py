"""The MCP tool: call the tools of any Model Context Protocol server, over stdio or HTTP.

The model writes ``<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>``; the
tool sends it to the server and shows the result inside ``<tool_response>...</tool_response>``.

One client session is opened on first use and reused for every call, on an event loop that runs in
a background thread (the env API is synchronous; the ``mcp`` client is async). Each call has a
timeout; a call that times out or loses the connection is retried (``retries`` times, after
reconnecting) -- an error the *server* reports (unknown tool, bad arguments, a tool that raised)
is an answer, shown to the model, and not retried. Needs ``gem-core[mcp]`` (the ``mcp`` SDK,
1.x or 2.x).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import threading
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from gem_core.errors import GemError
from gem_core.parsing import find_tagged
from gem_core.tools.base import Tool, ToolCall, ToolResult, tool_call

logger = logging.getLogger(__name__)

_CALL_TAGS = ("<tool_call>", "</tool_call>")


class MCPError(GemError, RuntimeError):
    """The MCP server could not be reached or set up (raised when connecting, not per call)."""


def _require_mcp() -> Any:
    try:
        import mcp
    except ImportError:
        raise MCPError("the MCP tool needs the MCP SDK: pip install -e '.[mcp]'") from None
    return mcp


def _server_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions meaning "the server answered with an error" (named differently in mcp 1.x and 2.x)."""
    from mcp.shared import exceptions

    return tuple(t for t in (getattr(exceptions, "McpError", None), getattr(exceptions, "MCPError", None)) if t)


def _field(obj: Any, snake: str, camel: str, default: Any = None) -> Any:
    """A field of an mcp model: 2.x names it in snake_case, 1.x in camelCase."""
    value = getattr(obj, snake, None)
    return getattr(obj, camel, default) if value is None else value


@asynccontextmanager
async def _http_streams(url: str, headers: dict[str, str] | None) -> Any:
    import inspect

    from mcp.client import streamable_http

    opener = getattr(streamable_http, "streamable_http_client", None) or streamable_http.streamablehttp_client
    params = inspect.signature(opener).parameters
    kwargs: dict[str, Any] = {}
    if headers and "headers" in params:  # mcp 1.x
        kwargs["headers"] = headers
    elif headers and "http_client" in params:  # mcp 2.x: headers go on the HTTP client
        from mcp.shared._httpx_utils import create_mcp_http_client

        kwargs["http_client"] = create_mcp_http_client(headers=headers)
    async with opener(url, **kwargs) as streams:
        yield streams[0], streams[1]


@asynccontextmanager
async def _open_session(url: str | None, command: list[str] | None, env: dict[str, str] | None, headers: dict[str, str] | None) -> Any:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async with AsyncExitStack() as stack:
        if url is not None:
            read, write = await stack.enter_async_context(_http_streams(url, headers))
        else:
            assert command is not None
            params = StdioServerParameters(command=command[0], args=command[1:], env=env)
            streams = await stack.enter_async_context(stdio_client(params))
            read, write = streams[0], streams[1]
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


class _Connection:
    """One MCP client session, owned by a task on a private event loop in a daemon thread.

    The transport's context managers must be entered and left by the same task, so one "owner"
    task opens the session and holds it until asked to drop it; calls run as their own tasks and
    use the session meanwhile.
    """

    def __init__(self, url: str | None, command: list[str] | None, env: dict[str, str] | None, headers: dict[str, str] | None):
        self._args = (url, command, env, headers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gem-mcp-client", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._drop: asyncio.Event | None = None
        self.tools: list[Any] = []

    def _submit(self, coro: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def _own(self, ready: asyncio.Future[list[Any]]) -> None:
        self._drop = asyncio.Event()
        try:
            async with _open_session(*self._args) as session:
                listed = await session.list_tools()
                self._session = session
                if not ready.done():
                    ready.set_result(list(listed.tools))
                await self._drop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None

    @property
    def connected(self) -> bool:
        return self._session is not None

    def connect(self, timeout: float) -> None:
        """Open the session (and, for stdio, start the server); raises on failure or timeout."""

        async def start() -> list[Any]:
            ready: asyncio.Future[list[Any]] = self._loop.create_future()
            self._owner = asyncio.ensure_future(self._own(ready))
            try:
                return await asyncio.wait_for(asyncio.shield(ready), timeout)
            except BaseException:
                self._owner.cancel()
                raise

        self.tools = self._submit(start(), timeout + 5)

    def disconnect(self) -> None:
        """Close the session (stopping a stdio server); safe when not connected."""

        async def stop() -> None:
            if self._drop is not None:
                self._drop.set()
            if self._owner is not None:
                try:
                    await asyncio.wait_for(self._owner, 10)
                except BaseException:  # noqa: BLE001 - a transport that will not close cleanly is dropped
                    self._owner.cancel()
            self._owner = None

        if self._thread.is_alive():
            try:
                self._submit(stop(), 15)
            except Exception as exc:  # noqa: BLE001
                logger.warning("MCP session did not close cleanly: %r", exc)

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """One ``tools/call`` on the open session; raises TimeoutError after ``timeout`` seconds."""

        async def go() -> Any:
            if self._session is None:
                raise ConnectionError("the MCP session is closed")
            return await asyncio.wait_for(self._session.call_tool(name, arguments), timeout)

        return self._submit(go(), timeout + 2)

    def close(self) -> None:
        self.disconnect()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()


class MCPTool(Tool):
    """Calls the tools of one MCP server: ``MCPTool("http://127.0.0.1:8000/mcp")`` (streamable HTTP)
    or ``MCPTool(["python", "server.py"])`` / ``MCPTool("python server.py")`` (stdio).

    ``timeout`` bounds each call, ``connect_timeout`` the start of the session; failed calls are
    retried ``retries`` times, ``retry_delay`` seconds apart, on a fresh session. ``allowed_tools``
    restricts which server tools the model may call. ``env`` is the environment of a stdio server
    (on top of the MCP SDK's minimal default), ``headers`` are sent to an HTTP server.
    """

    name = "mcp"

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 30.0,
        retries: int = 2,
        retry_delay: float = 0.5,
        allowed_tools: Sequence[str] | None = None,
        max_output_chars: int = 8000,
    ):
        _require_mcp()
        url: str | None = None
        command: list[str] | None = None
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            url = server
        else:
            command = shlex.split(server) if isinstance(server, str) else [str(part) for part in server]
            if not command:
                raise ValueError("MCPTool needs a server URL or a command that starts a stdio server")
        self.server = server
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.retry_delay = retry_delay
        self.allowed_tools = set(allowed_tools) if allowed_tools is not None else None
        self.max_output_chars = max_output_chars
        self._connection = _Connection(url, command, env, headers)
        self._lock = threading.Lock()
        self._closed = False
        self.calls = 0
        self.reconnects = 0

    # session
    def _ensure_connected(self) -> None:
        if self._closed:
            raise MCPError("this MCPTool is closed")
        if not self._connection.connected:
            try:
                self._connection.connect(self.connect_timeout)
            except Exception as exc:
                raise MCPError(f"could not connect to the MCP server {self.server!r}: {exc!r}") from exc

    def tools(self) -> list[Any]:
        """The server's tools (connecting on first use), filtered by ``allowed_tools``."""
        with self._lock:
            self._ensure_connected()
            tools = self._connection.tools
        return [t for t in tools if self.allowed_tools is None or t.name in self.allowed_tools]

    # the Tool API
    def instructions(self) -> str:
        lines = [
            (
                'You can call these tools. Write one call as <tool_call>{"name": TOOL, "arguments": {...}}</tool_call> '
                "with JSON inside; the result comes back inside <tool_response>...</tool_response>."
            ),
        ]
        for tool in self.tools():
            schema = _field(tool, "input_schema", "inputSchema", {}) or {}
            description = " ".join((tool.description or "").split())
            lines.append(f"- {tool.name}: {description} Arguments (JSON schema): {json.dumps(schema, separators=(',', ':'))}")
        return "\n".join(lines)

    def find_call(self, action: str) -> ToolCall | None:
        return tool_call(self.name, find_tagged(action, *_CALL_TAGS))

    def run(self, call: ToolCall) -> ToolResult:
        try:
            request = json.loads(call.payload)
        except json.JSONDecodeError as exc:
            return self._error(f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})")
        if not isinstance(request, dict) or not isinstance(request.get("name"), str):
            return self._error('the tool call must be a JSON object {"name": ..., "arguments": {...}}')
        name, arguments = request["name"], request.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return self._error("'arguments' must be a JSON object")
        try:
            known = {t.name for t in self.tools()}
        except MCPError as exc:
            return self._error(str(exc), name=name)
        if name not in known:
            return self._error(f"there is no tool {name!r}; available: {', '.join(sorted(known)) or '(none)'}", name=name)
        return self._call_with_retries(name, arguments)

    def _call_with_retries(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        server_errors = _server_error_types()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_delay)
            with self._lock:
                try:
                    self._ensure_connected()
                    self.calls += 1
                    result = self._connection.call(name, arguments, self.timeout)
                except server_errors as exc:  # the server's answer: shown, not retried
                    return self._error(f"the server refused the call: {exc}", name=name)
                except MCPError as exc:
                    last = str(exc)
                    continue
                except (TimeoutError, asyncio.TimeoutError):
                    last = f"no answer within {self.timeout:g} s"
                except Exception as exc:  # noqa: BLE001 - the connection broke: reconnect and retry
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    return self._format(name, result, attempt)
                self._connection.disconnect()
                self.reconnects += 1
        return self._error(f"the call failed after {self.retries + 1} attempts: {last}", name=name)

    def _format(self, name: str, result: Any, attempt: int) -> ToolResult:
        parts = []
        for block in getattr(result, "content", []) or []:
            text = getattr(block, "text", None)
            parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')} content]")
        text = "\n".join(parts)
        if not text:
            structured = _field(result, "structured_content", "structuredContent")
            text = json.dumps(structured) if structured is not None else ""
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n[... cut at {self.max_output_chars} characters ...]"
        is_error = bool(_field(result, "is_error", "isError", False))
        return ToolResult(
            f"<tool_response>\n{text}\n</tool_response>",
            ok=not is_error,
            info={"tool_name": name, "is_error": is_error, "attempts": attempt + 1},
        )

    def _error(self, message: str, name: str | None = None) -> ToolResult:
        return ToolResult(f"<tool_response>\nerror: {message}\n</tool_response>", ok=False, info={"tool_name": name, "error": message})

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._connection.close()
