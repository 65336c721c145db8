"""The Python tool: model-written code runs in the bubblewrap sandbox of :mod:`gem_core.tools.sandbox`.

Every ``PythonTool()`` borrows this process's shared sandbox pool, so an env per episode costs no
processes of its own. The sandbox names are re-exported here for existing imports.
"""

from __future__ import annotations

import signal
from typing import Any

from gem_core.errors import INFRA_ERROR
from gem_core.parsing import find_fenced, find_tagged
from gem_core.tools.base import Tool, ToolCall, ToolResult, tool_call
from gem_core.tools.sandbox import (
    BWRAP_PACKAGE,
    DEFAULT_PRELOAD,
    TRUNCATION_MARKER,
    CaseResult,
    ExecutionResult,
    PythonSandbox,
    QueueTimeout,
    SandboxError,
    SandboxUnavailable,
    TestRun,
    bwrap_path,
    require_bwrap,
)

__all__ = [
    "BWRAP_PACKAGE",
    "DEFAULT_PRELOAD",
    "TRUNCATION_MARKER",
    "CaseResult",
    "ExecutionResult",
    "PythonSandbox",
    "PythonTool",
    "QueueTimeout",
    "SandboxError",
    "SandboxUnavailable",
    "TestRun",
    "bwrap_path",
    "require_bwrap",
]

_PYTHON_TAGS = ("<python>", "</python>")
_PYTHON_FENCES = frozenset({"python", "py"})


class PythonTool(Tool):
    """Runs the first ``<python>...</python>`` or fenced ```` ```python ```` block of an action.

    The observation is the program's stdout then stderr inside ``<output>...</output>``, with a
    note when it timed out, was cut, or exited with an error. ``ok`` is true only for a clean
    exit. By default the tool makes a :class:`PythonSandbox` handle on the process's shared pool
    (keyword arguments go to it); pass ``sandbox`` to use one you manage (it is then not closed by
    this tool).
    """

    name = "python"

    def __init__(self, sandbox: PythonSandbox | None = None, *, timeout: float | None = None, **sandbox_kwargs: Any):
        if sandbox is not None and sandbox_kwargs:
            raise TypeError("pass either a PythonSandbox or its keyword arguments, not both")
        self._owns_sandbox = sandbox is None
        if sandbox is None:
            if timeout is not None:
                sandbox_kwargs["timeout"] = timeout
            sandbox = PythonSandbox(**sandbox_kwargs)
        self.sandbox = sandbox
        self.timeout = timeout if timeout is not None else sandbox.timeout

    def instructions(self) -> str:
        return (
            "You can run Python code. Write a complete program inside <python>...</python> tags (or a "
            "```python fenced block); it runs in a fresh sandbox without network access, and what it "
            "prints comes back to you inside <output>...</output>. Variables do not carry over between "
            f"runs. Each run may take at most {self.timeout:g} seconds. Use print() to see results."
        )

    def find_call(self, action: str) -> ToolCall | None:
        return tool_call(self.name, find_tagged(action, *_PYTHON_TAGS), find_fenced(action, _PYTHON_FENCES))

    def run(self, call: ToolCall) -> ToolResult:
        code = call.payload.strip("\n")
        if not code.strip():
            return ToolResult("<output>\n(no code: the block was empty)\n</output>", ok=False, info={"empty": True})
        result = self.sandbox.run(code, timeout=self.timeout)
        text = result.output(self.sandbox.max_output_bytes).rstrip("\n")
        notes = []
        if result.timed_out:
            notes.append(f"[timed out after {self.timeout:g} s: the program was stopped]")
        elif result.signal is not None and not result.truncated:
            notes.append(f"[the program was killed by signal {result.signal} ({_signal_name(result.signal)})]")
        elif result.exit_code not in (0, None):
            notes.append(f"[exit code {result.exit_code}]")
        body = "\n".join(part for part in [text, *notes] if part) or "(no output)"
        info = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "duration": result.duration,
        }
        if result.error is not None:
            info["sandbox_error"] = result.error
            info[INFRA_ERROR] = f"python sandbox: {result.error}"
        return ToolResult(f"<output>\n{body}\n</output>", ok=result.ok, info=info)

    def close(self) -> None:
        if self._owns_sandbox:
            self.sandbox.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"
