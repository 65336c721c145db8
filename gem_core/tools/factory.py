"""Tools by name: what a dataset row's ``tools`` field may hold, and the tool each name makes.

A row names its tools (``"python,search"``) because a row cannot carry a tool object; every worker that
plays the row builds them here. Each tool's module is imported when its name is made, so optional
dependencies are needed only by the tool that uses them.
"""

from __future__ import annotations

import os
from typing import Any

KNOWN_TOOLS = ("python", "search")


def parse_tools(value: Any) -> list[str]:
    """Tool names from a row: a list/tuple/array of names, a comma-separated string, or nothing."""
    if value is None:
        return []
    if hasattr(value, "tolist"):  # numpy arrays and scalars from a parquet/pandas row
        value = value.tolist()
    names = [t.strip() for t in value.split(",")] if isinstance(value, str) else [str(t).strip() for t in value]
    names = [t for t in names if t]
    unknown = [t for t in names if t not in KNOWN_TOOLS]
    if unknown:
        raise ValueError(f"unknown env tool(s) {unknown}; known: {', '.join(KNOWN_TOOLS)}")
    return names


SEARCH_URL_VAR = "GEM_SEARCH_URL"
SEARCH_CORPUS_VAR = "GEM_SEARCH_CORPUS"


def make_tool(name: str) -> Any:
    """A fresh tool by name: ``python`` (sandboxed PythonTool) or ``search`` (SearchTool).

    A dataset row cannot carry a search index, so the search backend comes from the worker's
    environment: ``GEM_SEARCH_URL`` (a ``gem-core serve-search`` server that every env worker shares)
    or ``GEM_SEARCH_CORPUS`` (a JSONL corpus indexed in this process).
    """
    if name == "python":
        from gem_core.tools.python import PythonTool  # bubblewrap's tool: loaded when a row asks for it

        return PythonTool()
    if name == "search":
        from gem_core.tools.search import SearchTool  # optional dependency (bm25s) for a local corpus

        url, corpus = os.environ.get(SEARCH_URL_VAR), os.environ.get(SEARCH_CORPUS_VAR)
        if url:
            return SearchTool(url=url)
        if corpus:
            return SearchTool(corpus)
        raise ValueError(
            f"the search tool needs a backend: set {SEARCH_URL_VAR} to a retrieval server (`gem-core serve-search`) or {SEARCH_CORPUS_VAR} to a JSONL corpus"
        )
    raise ValueError(f"unknown env tool {name!r}; known: {', '.join(KNOWN_TOOLS)}")
