"""Parsing actions out of model text, and echoing model text back within a bound.

A move is the content of the last ``\\boxed{...}`` (GEM's format). Other LaTeX boxes (``\\fbox``)
are not moves. Whatever an env quotes back from an action goes through :func:`echo`, so an
observation never grows with the action: a 10 MB answer is quoted as its first
:data:`ECHO_CHARS` characters and its length.

Tagged blocks (``<bash>...</bash>``, ``<answer>``, ``<tool_call>``...) and fenced blocks (```` ```python ````)
are found by :func:`find_tagged` / :func:`all_tagged` and :func:`find_fenced` / :func:`all_fenced`, in time
linear in the text (a ``(.*?)`` regex is quadratic on hostile text): every action parser uses them.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Collection
from typing import NamedTuple

BOX_MARKER = "\\boxed"

#: The most characters of model text (or of a bad argument) an error message or observation quotes.
ECHO_CHARS = 40

# The common case in one C call, at the last marker (str.rfind): the marker, optional spaces and a
# brace-free body. Matching at a position never backtracks into earlier text, so the cost is linear.
BOXED_AT = re.compile(r"\\boxed *\{([^{}]*)\}").match
# The rest: the opening brace, then str.find for the closing one (memchr speed: a 10 MB body takes ~5 ms).
_OPEN_BRACE = re.compile(r" *\{").match
_SHORT = 4096  # bodies up to this long take the one-call regex; longer ones str.find

# Nested braces longer than this are matched with numpy (a running brace count) instead of a Python loop.
_NESTED_LOOP_CHARS = 10_000


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, braces balanced.

    Returns ``None`` when there is none, when its braces never close, or when the last marker has no
    brace after it (an earlier box does not count then). ``\\boxed {x}`` (spaces before the brace)
    is accepted, as LaTeX does.
    """
    if not isinstance(text, str):
        return None
    i = text.rfind(BOX_MARKER)
    if i < 0:
        return None
    if len(text) - i < _SHORT:
        found = BOXED_AT(text, i)
        if found is not None:
            return found[1]
    opened = _OPEN_BRACE(text, i + len(BOX_MARKER))
    if opened is None:
        return None
    start = opened.end()
    close = text.find("}", start)
    if close < 0:
        return None
    if text.find("{", start, close) < 0:  # the common case: no nested braces
        return text[start:close]
    return _balanced(text, start)


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` (just after an opening brace) to its matching closing brace, or None."""
    if len(text) - start > _NESTED_LOOP_CHARS:
        import numpy as np

        codes = np.frombuffer(text[start:].encode("utf-32-le"), dtype="<u4")
        change = (codes == 123).view(np.int8) - (codes == 125).view(np.int8)  # 123 "{", 125 "}"
        below = np.cumsum(change, dtype=np.int32) < 0  # depth relative to the opening brace
        end = int(below.argmax())
        return text[start : start + end] if below[end] else None
    depth = 1
    for j in range(start, len(text)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:j]
    return None


def boxed(content: object) -> str:
    """Wrap ``content`` as ``\\boxed{content}``, the action format of the games."""
    return "\\boxed{" + str(content) + "}"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = ECHO_CHARS + 10
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def echo(value: object) -> str:
    """``value`` quoted for a message, bounded: a string of at most :data:`ECHO_CHARS` characters as its
    ``repr``; a longer one as its first :data:`ECHO_CHARS` characters and its length
    (``'\\\\boxed{1111…' (10000000 chars)``); anything else as a shortened ``repr``."""
    if isinstance(value, str):
        if len(value) <= ECHO_CHARS:
            return repr(value)
        return f"{value[:ECHO_CHARS] + '…'!r} ({len(value)} chars)"
    return _REPR.repr(value)


def echo_bare(value: object) -> str:
    """``str(value)`` unquoted (a guess, a number read from model text) when it has at most
    :data:`ECHO_CHARS` characters, else :func:`echo` of it (quoted prefix and length)."""
    text = str(value)
    return text if len(text) <= ECHO_CHARS else echo(text)


# -- tagged and fenced blocks, in linear time ------------------------------------------------------
# ``re.compile(r"<tag>(.*?)</tag>", re.DOTALL)`` is quadratic on text with many opening tags and no closing
# one: the regex engine tries every opening tag and scans to the end from each (1 MB of "<bash>" took
# minutes, holding the GIL). These helpers find the same matches as those regexes with ``str.find``: each
# character is looked at a bounded number of times, whatever the text.


class Block(NamedTuple):
    """One block found in text: its body, the span of the whole block (tags or fences included), and
    for a fenced block the word after the opening fence ("" when there is none)."""

    body: str
    start: int
    end: int
    lang: str = ""


def find_tagged(text: str, open_tag: str, close_tag: str, start: int = 0) -> Block | None:
    """The first ``open_tag ... close_tag`` block at or after ``start``: what
    ``re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL).search(text, start)`` finds."""
    opened = text.find(open_tag, start)
    if opened < 0:
        return None
    body_start = opened + len(open_tag)
    closed = text.find(close_tag, body_start)
    if closed < 0:  # no closing tag after the first opening one: none after any later one either
        return None
    return Block(text[body_start:closed], opened, closed + len(close_tag))


def all_tagged(text: str, open_tag: str, close_tag: str) -> list[Block]:
    """Every ``open_tag ... close_tag`` block, left to right, not overlapping: the regex's ``finditer``."""
    found: list[Block] = []
    position = 0
    while (block := find_tagged(text, open_tag, close_tag, position)) is not None:
        found.append(block)
        position = block.end
    return found


FENCE = "```"
# What follows an opening fence up to its newline: spaces, one word, spaces. It always matches (maybe empty)
# at its first try, without backtracking, so checking a fence costs the length of its header line.
_FENCE_HEADER = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)[ \t]*").match


def find_fenced(text: str, langs: Collection[str] | None = None, start: int = 0) -> Block | None:
    """The first fenced block (```` ```lang\\n ... ``` ````) at or after ``start`` whose word after the opening
    fence is in ``langs`` ("" for a bare fence; ``None``: any word of letters, digits, ``_+-``). The same
    match as ``re.compile(r"```[ \\t]*(LANGS)[ \\t]*\\n(.*?)```", re.DOTALL).search(text, start)``."""
    position = start
    while (opened := text.find(FENCE, position)) >= 0:
        header = _FENCE_HEADER(text, opened + len(FENCE))
        newline = header.end()
        if newline < len(text) and text[newline] == "\n" and (langs is None or header[1] in langs):
            closed = text.find(FENCE, newline + 1)
            if closed < 0:  # no fence after this one's header: no later fence can open a block either
                return None
            return Block(text[newline + 1 : closed], opened, closed + len(FENCE), header[1])
        position = opened + 1  # "````py" opens at its second backtick
    return None


def all_fenced(text: str, langs: Collection[str] | None = None) -> list[Block]:
    """Every fenced block (see :func:`find_fenced`), left to right, not overlapping: the regex's ``finditer``."""
    found: list[Block] = []
    position = 0
    while (block := find_fenced(text, langs, position)) is not None:
        found.append(block)
        position = block.end
    return found
