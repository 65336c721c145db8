"""last_boxed: the action parser every game uses, checked against a plain reference implementation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.parsing import boxed, last_boxed


def reference_last_boxed(text: object) -> str | None:
    """Character by character: the rightmost marker, optional spaces, then a balanced brace group."""
    if not isinstance(text, str):
        return None
    starts = [(i, len(m)) for m in ("\\boxed", "\\fbox") for i in range(len(text)) if text.startswith(m, i)]
    if not starts:
        return None
    i, width = max(starts)
    i += width
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{7}", "7"),
        ("I think \\boxed{3} no, \\boxed{4}", "4"),
        ("\\boxed{3} then \\fbox{5}", "5"),
        ("\\fbox{5} then \\boxed{3}", "3"),
        ("\\boxed {x}", "x"),
        ("\\boxed   {x y}", "x y"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b}} tail }", "{a}{b}"),
        ("\\boxed{}", ""),
        ("\\boxed{1} \\boxed", None),  # the last marker has no brace: no move, not the earlier one
        ("\\boxed{1} \\boxed{2", None),  # unclosed
        ("\\boxed{a{b}", None),  # nested and unclosed
        ("boxed{1}", None),
        ("", None),
        ("\\boxedx{1}", None),
        ("\\boxed\n{1}", None),  # only spaces may sit between marker and brace
        (None, None),
        (42, None),
    ],
)
def test_last_boxed_cases(text: object, expected: str | None) -> None:
    assert last_boxed(text) == expected  # type: ignore[arg-type]
    assert reference_last_boxed(text) == expected


_pieces = st.sampled_from(["\\boxed", "\\fbox", "{", "}", " ", "x", "1 2", "\\", "boxed", "\n", "é"])


@settings(max_examples=600, deadline=None)
@given(st.lists(_pieces, max_size=14).map("".join) | st.text(max_size=30))
def test_last_boxed_matches_reference(text: str) -> None:
    assert last_boxed(text) == reference_last_boxed(text)


@given(st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=20))
def test_boxed_round_trips(content: str) -> None:
    assert last_boxed("answer: " + boxed(content)) == content
