"""A task: the env that one dataset row names (env id, env kwargs, tools).

Dataset builders write these fields and every trainer plugin's agent loop reads them back with
:func:`make_task_env`, so the same row builds the same env in verl, OpenRLHF and the core runner.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from gem_core.core import Env

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


def parse_env_kwargs(value: Any) -> dict[str, Any]:
    """Env kwargs from a row: a mapping, a JSON object string, or nothing."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env kwargs are not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"env kwargs must be a JSON object, got {type(value).__name__}")
    return dict(value)


SEARCH_URL_VAR = "GEM_SEARCH_URL"
SEARCH_CORPUS_VAR = "GEM_SEARCH_CORPUS"


def make_tool(name: str) -> Any:
    """A fresh tool by name: ``python`` (sandboxed PythonTool) or ``search`` (SearchTool).

    A dataset row cannot carry a search index, so the search backend comes from the worker's
    environment: ``GEM_SEARCH_URL`` (a ``gem-core serve-search`` server that every env worker shares)
    or ``GEM_SEARCH_CORPUS`` (a JSONL corpus indexed in this process).
    """
    if name == "python":
        from gem_core.tools import PythonTool

        return PythonTool()
    if name == "search":
        from gem_core.tools import SearchTool

        url, corpus = os.environ.get(SEARCH_URL_VAR), os.environ.get(SEARCH_CORPUS_VAR)
        if url:
            return SearchTool(url=url)
        if corpus:
            return SearchTool(corpus)
        raise ValueError(
            f"the search tool needs a backend: set {SEARCH_URL_VAR} to a retrieval server "
            f"(`gem-core serve-search`) or {SEARCH_CORPUS_VAR} to a JSONL corpus"
        )
    raise ValueError(f"unknown env tool {name!r}; known: {', '.join(KNOWN_TOOLS)}")


def make_task_env(env_id: str, env_kwargs: Any = None, tools: Iterable[str] | str | None = None) -> Env:
    """``gem_core.make(env_id, **env_kwargs)``, wrapped in a ToolEnvWrapper when ``tools`` names any."""
    from gem_core.registry import make

    env = make(str(env_id), **parse_env_kwargs(env_kwargs))
    names = parse_tools(tools)
    if names:
        from gem_core.wrappers import ToolEnvWrapper

        env = ToolEnvWrapper(env, [make_tool(name) for name in names])
    return env


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every ``gem-core make-dataset TRAINER`` shares: which env, how many rows, from which seed."""
    parser.add_argument("--env", required=True, help="env id, e.g. game:Sudoku-v0-easy")
    parser.add_argument("--n", type=int, required=True, help="rows to write (one episode each)")
    parser.add_argument("--seed-start", type=int, default=0, help="seed of the first row (default 0); row i gets seed-start + i")
    parser.add_argument("--env-kwargs", default="{}", help='JSON object of make() kwargs, e.g. \'{"max_turns": 20}\'')
    parser.add_argument("--tools", default="", help="comma-separated tools to wrap the env with: python, search")
    parser.add_argument("--max-turns", type=int, default=None, help="turn limit on top of the env's own")


def task_arguments(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """``(env_kwargs, tools)`` from the parsed shared options, validated (clear ValueErrors)."""
    return parse_env_kwargs(args.env_kwargs), parse_tools(args.tools)
