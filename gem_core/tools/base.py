"""What every tool is: it finds its call in an action, runs it, and says what happened.

A tool never raises on bad model text or on a failure of the thing it calls (a crashed snippet,
a search server that is down): it returns a :class:`ToolResult` with ``ok=False`` and an
observation that explains the failure to the model. Errors in how the tool was *configured*
(bubblewrap missing, a corpus file that does not exist) do raise, when the tool is built.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from gem_core.parsing import Block


@dataclass(frozen=True)
class ToolCall:
    """One call found in an action: the text inside the tool's tags and where the call sits."""

    tool: str
    payload: str
    start: int  # index of the call's first character in the action
    end: int  # index just past the call's last character


@dataclass
class ToolResult:
    """What a tool call gave: the observation shown to the model, success, and details for info."""

    observation: str
    ok: bool
    info: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    """A tool the model calls by writing tagged text in its action (``<python>...</python>``)."""

    name: str = "tool"

    @abstractmethod
    def instructions(self) -> str:
        """Text added to the first observation telling the model how to call this tool."""

    @abstractmethod
    def find_call(self, action: str) -> ToolCall | None:
        """The first complete call in ``action``, or ``None``."""

    @abstractmethod
    def run(self, call: ToolCall) -> ToolResult:
        """Execute a call found by :meth:`find_call`. Never raises for the call's own failures."""

    def execute(self, action: str) -> ToolResult | None:
        """Find and run the first call in ``action``; ``None`` when it has none."""
        call = self.find_call(action)
        return None if call is None else self.run(call)

    def close(self) -> None:
        """Release processes, sessions and sockets. Safe to call twice."""

    def __enter__(self) -> Tool:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tool_call(tool: str, *blocks: Block | None) -> ToolCall | None:
    """The block of ``blocks`` (each found by :mod:`gem_core.parsing`, in linear time) that starts first in the
    action, as a :class:`ToolCall`; ``None`` when none was found."""
    found = [block for block in blocks if block is not None]
    if not found:
        return None
    first = min(found, key=lambda block: block.start)
    return ToolCall(tool=tool, payload=first.body, start=first.start, end=first.end)


def first_match(patterns: list[re.Pattern[str]], action: str, tool: str) -> ToolCall | None:
    """The match of any of ``patterns`` that starts first in ``action``, as a :class:`ToolCall`.

    For a tool's own patterns; a ``(.*?)`` pattern is quadratic on text with many opening tags and no
    closing one (the shipped tools use :func:`tool_call` with :mod:`gem_core.parsing`'s linear finders)."""
    best: re.Match[str] | None = None
    for pattern in patterns:
        match = pattern.search(action)
        if match is not None and (best is None or match.start() < best.start()):
            best = match
    if best is None:
        return None
    return ToolCall(tool=tool, payload=best.group(1), start=best.start(), end=best.end())
