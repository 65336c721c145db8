"""Tools a model calls from its action text: a sandboxed Python, search, and MCP servers.

Use them through :class:`gem_core.wrappers.ToolEnvWrapper`, which adds their instructions to the
first observation and turns each call into a tool turn. Each tool lives in its own module and is
imported on first use, so ``import gem_core.tools`` costs nothing and optional dependencies
(``bm25s`` for search, ``mcp`` for MCP) are needed only by the tool that uses them.

==========================  ===============================  ========================================
tool                        call syntax                      needs
==========================  ===============================  ========================================
``PythonTool``              ``<python>...</python>``,        bubblewrap (Debian package
                            ```` ```python ```` fences        ``bubblewrap``)
``SearchTool``              ``<search>...</search>``         ``gem-core[search]`` for the embedded
                                                             BM25 index; nothing for a server
``MCPTool``                 ``<tool_call>{"name": ...,       ``gem-core[mcp]``
                            "arguments": {...}}</tool_call>``
==========================  ===============================  ========================================
"""

from __future__ import annotations

import importlib
from typing import Any

from gem_core.tools.base import Tool, ToolCall, ToolResult

_LAZY = {
    "PythonTool": "gem_core.tools.python",
    "PythonSandbox": "gem_core.tools.python",
    "ExecutionResult": "gem_core.tools.python",
    "SandboxError": "gem_core.tools.python",
    "TestRun": "gem_core.tools.python",
    "CaseResult": "gem_core.tools.python",
    "SandboxUnavailable": "gem_core.tools.python",
    "SearchTool": "gem_core.tools.search",
    "BM25Index": "gem_core.tools.search",
    "RetrievalClient": "gem_core.tools.search",
    "MCPTool": "gem_core.tools.mcp",
}

__all__ = [
    "BM25Index",
    "ExecutionResult",
    "MCPTool",
    "PythonSandbox",
    "PythonTool",
    "RetrievalClient",
    "SandboxUnavailable",
    "SearchTool",
    "Tool",
    "ToolCall",
    "ToolResult",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gem_core.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
