"""Parsing actions out of model text."""

from __future__ import annotations

_BOX_MARKERS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    Returns ``None`` when there is none or its braces never close. ``\\boxed {x}`` (a space before
    the brace) is accepted, as LaTeX does.
    """
    if not isinstance(text, str):
        return None
    start = -1
    for marker in _BOX_MARKERS:
        at = text.rfind(marker)
        if at > start:
            start, width = at, len(marker)
    if start < 0:
        return None
    i = start + width
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n or text[i] != "{":
        return None
    close = text.find("}", i + 1)
    if close < 0:
        return None
    if text.find("{", i + 1, close) < 0:  # the common case: no nested braces
        return text[i + 1 : close]
    depth = 0
    for j in range(i, n):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def boxed(content: object) -> str:
    """Wrap ``content`` as ``\\boxed{content}``, the action format of the games."""
    return "\\boxed{" + str(content) + "}"
