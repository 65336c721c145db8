"""A small MCP server for the MCP tool tests: ``python mcp_test_server.py stdio`` or ``... http PORT``.

Works with the mcp SDK 1.x (``FastMCP``) and 2.x (``MCPServer``). Its tools: ``add``, ``echo``,
``boom`` (raises), ``slow`` (sleeps), ``calls`` (how many calls this server process has served --
it shows whether a session, and the process behind a stdio one, is reused).
"""

from __future__ import annotations

import sys
import time

try:
    from mcp.server.mcpserver import MCPServer as Server  # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x

server = Server("gem-core-test")
_served = {"calls": 0}


def _count() -> None:
    _served["calls"] += 1


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _count()
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    _count()
    return text


@server.tool()
def boom() -> str:
    """Always fails."""
    _count()
    raise ValueError("boom on purpose")


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    _count()
    time.sleep(seconds)
    return "done"


@server.tool()
def calls() -> int:
    """How many tool calls this server process has served, this one included."""
    _count()
    return _served["calls"]


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        port = int(sys.argv[2])
        try:
            server.run("streamable-http", host="127.0.0.1", port=port)  # mcp 2.x
        except TypeError:
            server.settings.host, server.settings.port = "127.0.0.1", port  # mcp 1.x
            server.run("streamable-http")
