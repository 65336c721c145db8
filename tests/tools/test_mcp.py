"""The MCP tool against a real MCP server the test starts (stdio and streamable HTTP, loopback only)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from gem_core.tools.mcp import MCPError, MCPTool

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


def call(tool: MCPTool, name: str, arguments: str = "{}"):
    result = tool.execute(f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>')
    assert result is not None
    return result


@pytest.fixture(scope="module")
def stdio_tool():
    # A generous limit: with 1 s, the error-reply test once failed on a loaded 2-core machine.
    tool = MCPTool([sys.executable, SERVER, "stdio"], timeout=10.0, retries=1, retry_delay=0.0)
    yield tool
    tool.close()


@pytest.fixture
def impatient_tool():
    """A tool with a 1 s limit, for the test that a call running past it is retried."""
    tool = MCPTool([sys.executable, SERVER, "stdio"], timeout=1.0, retries=1, retry_delay=0.0)
    yield tool
    tool.close()


def _free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@pytest.fixture(scope="module")
def http_url():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("the MCP test server exited at start-up")
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the MCP test server did not listen within 30 s")
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_stdio_lists_tools_and_calls_them(stdio_tool):
    text = stdio_tool.instructions()
    assert "<tool_call>" in text and "- add: Add two integers." in text and '"a":' in text
    result = call(stdio_tool, "add", '{"a": 2, "b": 40}')
    assert result.ok and result.observation == "<tool_response>\n42\n</tool_response>"
    assert call(stdio_tool, "echo", '{"text": "hello there"}').observation == "<tool_response>\nhello there\n</tool_response>"


def test_one_session_is_reused_across_calls(stdio_tool):
    first = int(call(stdio_tool, "calls").observation.split("\n")[1])
    second = int(call(stdio_tool, "calls").observation.split("\n")[1])
    assert second == first + 1  # the same server process (started once, for the session) answered both


def test_errors_are_tool_results_not_exceptions(stdio_tool):
    raised = call(stdio_tool, "boom")
    assert not raised.ok and raised.info["is_error"] and "boom" in raised.observation
    unknown = call(stdio_tool, "nope")
    assert not unknown.ok and "there is no tool 'nope'" in unknown.observation and "add" in unknown.observation
    bad_json = stdio_tool.execute("<tool_call>{name: add}</tool_call>")
    assert bad_json is not None and not bad_json.ok and "not valid JSON" in bad_json.observation
    bad_args = stdio_tool.execute('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>')
    assert bad_args is not None and not bad_args.ok and "must be a JSON object" in bad_args.observation
    wrong_type = call(stdio_tool, "add", '{"a": "x", "b": 1}')
    assert not wrong_type.ok


def test_timeout_retries_on_a_fresh_session(impatient_tool):
    assert call(impatient_tool, "add", '{"a": 1, "b": 1}').ok  # the session is open before the clock starts
    started = time.monotonic()
    slow = call(impatient_tool, "slow", '{"seconds": 30}')
    elapsed = time.monotonic() - started
    assert not slow.ok and "after 2 attempts" in slow.observation and "no answer within 1 s" in slow.observation
    assert elapsed < 25  # two 1 s attempts and a reconnect, not the slow call's 30 s; room for a loaded machine
    assert impatient_tool.reconnects >= 1
    # After the reconnect a new server process answers: its call counter starts again.
    assert int(call(impatient_tool, "calls").observation.split("\n")[1]) == 1
    assert call(impatient_tool, "add", '{"a": 1, "b": 1}').ok


def test_http_transport(http_url):
    tool = MCPTool(http_url, timeout=5.0)
    try:
        assert call(tool, "add", '{"a": 20, "b": 22}').observation == "<tool_response>\n42\n</tool_response>"
        first = int(call(tool, "calls").observation.split("\n")[1])
        assert int(call(tool, "calls").observation.split("\n")[1]) == first + 1
        assert {t.name for t in tool.tools()} == {"add", "echo", "boom", "slow", "calls"}
    finally:
        tool.close()


def test_allowed_tools_restricts_what_the_model_may_call(http_url):
    tool = MCPTool(http_url, allowed_tools=["echo"])
    try:
        assert "- add:" not in tool.instructions() and "- echo:" in tool.instructions()
        assert not call(tool, "add", '{"a": 1, "b": 2}').ok
        assert call(tool, "echo", '{"text": "ok"}').ok
    finally:
        tool.close()


def test_unreachable_server_is_a_clear_error():
    tool = MCPTool(f"http://127.0.0.1:{_free_port()}/mcp", connect_timeout=3.0, retries=0)
    try:
        with pytest.raises(MCPError, match="could not connect"):
            tool.instructions()
        result = call(tool, "add", '{"a": 1, "b": 2}')
        assert not result.ok and "could not connect" in result.observation
    finally:
        tool.close()
    with pytest.raises(MCPError, match="closed"):
        tool.tools()


def test_parsing():
    tool = MCPTool([sys.executable, SERVER, "stdio"])
    try:
        assert tool.find_call("no call") is None
        found = tool.find_call('x <tool_call>{"name": "a"}</tool_call> y <tool_call>{}</tool_call>')
        assert found is not None and found.payload == '{"name": "a"}'
    finally:
        tool.close()  # never connected: closing is still fine
