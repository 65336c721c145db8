"""Parsing actions out of model text."""

from __future__ import annotations

import re

# One C call for the common case: the greedy ``.*`` backtracks to the rightmost marker; then,
# optionally, spaces and a brace-free content. The tail is optional, so it always succeeds and the
# engine never backtracks into ``.*`` for an earlier marker: no atomic group is needed (Python 3.10's
# ``re`` has none), and the cost stays linear. No match: no marker. A match without group 1: nested
# braces or no/unclosed brace, handled in Python below.
_LAST_BOX = re.compile(r".*\\(?:boxed|fbox)(?: *\{([^{}]*)\})?", re.DOTALL).match


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    Returns ``None`` when there is none or its braces never close. ``\\boxed {x}`` (a space before
    the brace) is accepted, as LaTeX does.
    """
    if not isinstance(text, str):
        return None
    found = _LAST_BOX(text)
    if found is None:
        return None
    content = found[1]
    if content is not None:
        return content
    i = found.end()
    # The rest: nested braces, or no brace / an unclosed one (None).
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
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
