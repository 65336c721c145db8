"""last_boxed: the action parser every game uses, checked against a plain reference implementation;
echo: how model text is quoted back, bounded."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.parsing import ECHO_CHARS, boxed, echo, last_boxed


def reference_last_boxed(text: object) -> str | None:
    """Character by character: the rightmost \\boxed marker, optional spaces, then a balanced brace group."""
    if not isinstance(text, str):
        return None
    starts = [i for i in range(len(text)) if text.startswith("\\boxed", i)]
    if not starts:
        return None
    i = max(starts) + len("\\boxed")
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
        ("\\boxed{3} then \\fbox{5}", "3"),  # \\fbox is not a move (GEM reads \\boxed only)
        ("\\fbox{5} then \\boxed{3}", "3"),
        ("\\fbox{5}", None),
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


_N = 200_000
# Inputs that would make a backtracking parser go quadratic or worse: many markers, many backslashes,
# long runs of spaces, an unclosed brace with a long body, deep nesting, many opening braces.
_PATHOLOGICAL = {
    "no marker": "x" * _N,
    "markers, no braces": "\\boxed" * (_N // 6),
    "markers and spaces": "\\boxed " * (_N // 7),
    "backslashes": "\\" * _N,
    "spaces then no brace": "\\boxed" + " " * _N + "x",
    "unclosed body": "\\boxed{" + "a" * _N,
    "unclosed, then a marker": "\\boxed{" + "a" * _N + "\\fbox",
    "deep nesting": "\\boxed" + "{" * (_N // 2) + "}" * (_N // 2),
    "deep nesting, unclosed": "\\boxed" + "{" * _N,
    "many groups": "\\boxed{" + "{a}" * (_N // 3) + "}",
    "every marker boxed": "\\boxed{1} " * (_N // 11),
    "half markers": "\\boxe" * (_N // 5) + "\\fbox{ok}",
}


@pytest.mark.parametrize("name", list(_PATHOLOGICAL))
def test_last_boxed_is_linear_on_pathological_input(name: str) -> None:
    text = _PATHOLOGICAL[name]
    start = time.process_time()  # CPU seconds: what the work costs, whatever else the machine runs
    got = last_boxed(text)
    elapsed = time.process_time() - start
    # Linear work is ~1 ms here; catastrophic backtracking on 200k characters would take minutes.
    assert elapsed < 1.0, f"{name}: {elapsed:.2f} CPU s"
    assert got == reference_last_boxed(text)


def test_echo_quotes_short_text_whole_and_long_text_as_prefix_and_length() -> None:
    assert echo("up") == "'up'"
    assert echo("x" * ECHO_CHARS) == repr("x" * ECHO_CHARS)
    action = "\\boxed{" + "1" * 10_000_000 + "}"
    tracemalloc.start()
    quoted = echo(action)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak  # a prefix and a length: no copy (repr or slice) of the 10 MB action
    assert quoted == repr(action[:ECHO_CHARS] + "…") + " (10000008 chars)"
    assert len(echo(list(range(10**6)))) < 3 * ECHO_CHARS  # non-text values are shortened too
