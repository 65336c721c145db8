"""Every action parser (tagged blocks, fenced blocks) finds what its old ``(.*?)`` regex found, in linear time.

The regexes below are the parsers as they were: the reference for what a match is. On hostile text (many
opening tags and no closing one, a long run of spaces after a fence) they took minutes per megabyte and held
the GIL, which froze ``gem-core serve`` for every client; the finders in :mod:`gem_core.parsing` take
milliseconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.grading.code import last_code_block
from gem_core.grading.qa import last_answer_tag
from gem_core.parsing import all_fenced, all_tagged, find_fenced, find_tagged

# -- the old parsers, as the reference --------------------------------------------------------------
_OLD_TAG = re.compile(r"<bash>(.*?)</bash>", re.DOTALL)
_OLD_TERMINAL_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n(.*?)```", re.DOTALL)
_OLD_PYTHON_FENCE = re.compile(r"```[ \t]*(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
_OLD_CODE_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

_pieces = st.sampled_from(
    ["<bash>", "</bash>", "<bash", "bash>", "```", "``", "`", "bash", "sh", "shell", "py", "python", "c++", " ", "\t", "\n", "x", "é", "<answer>", "</answer>"]
)
_texts = st.lists(_pieces, max_size=16).map("".join)


@settings(max_examples=800, deadline=None)
@given(_texts, st.integers(min_value=0, max_value=40))
def test_tagged_blocks_are_the_regexes_matches(text: str, start: int) -> None:
    old = _OLD_TAG.search(text, start)
    new = find_tagged(text, "<bash>", "</bash>", start)
    assert (None if old is None else (old[1], old.start(), old.end())) == (None if new is None else new[:3])
    assert [block.body for block in all_tagged(text, "<bash>", "</bash>")] == _OLD_TAG.findall(text)


@settings(max_examples=800, deadline=None)
@given(_texts, st.integers(min_value=0, max_value=40))
def test_fenced_blocks_are_the_regexes_matches(text: str, start: int) -> None:
    for pattern, langs in [
        (_OLD_TERMINAL_FENCE, {"", "bash", "sh", "shell", "console"}),
        (_OLD_PYTHON_FENCE, {"python", "py"}),
    ]:
        old = pattern.search(text, start)
        new = find_fenced(text, langs, start)
        assert (None if old is None else (old[1], old.start(), old.end())) == (None if new is None else new[:3]), pattern.pattern
        assert [block.body for block in all_fenced(text, langs)] == pattern.findall(text)
    assert [(block.lang, block.body) for block in all_fenced(text)] == _OLD_CODE_FENCE.findall(text)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_answer_and_code_parsers_keep_their_rules(text: str) -> None:
    old_code = _OLD_CODE_FENCE.findall(text)
    assert last_code_block(text) == (old_code[-1][1] if "```" in text and old_code else None)
    if "<answer>" in text and text.find("</answer>", text.rfind("<answer>")) < 0:  # the fallback: the last regex match
        old_answers = _OLD_ANSWER.findall(text)
        assert last_answer_tag(text) == (old_answers[-1] if old_answers else None)


def test_the_shipped_parsers_keep_their_first_and_last_rules() -> None:
    from gem_core.envs.terminal.env import parse_action
    from gem_core.tools.python import PythonTool

    assert parse_action("```bash\nls\n```\nthen\n```sh\npwd\n```") == ("command", "pwd")  # the last block
    assert parse_action("<bash>ls</bash> <bash>pwd</bash>") == ("command", "pwd")
    assert parse_action("```bash\nls\n``` <bash>pwd</bash>") == ("command", "ls")  # a fence wins over a tag
    assert parse_action("````bash\nls\n```") == ("command", "ls")  # the fence opens at the second backtick
    assert parse_action("```python\nls\n```")[0] == "error"
    tool = PythonTool.find_call(SimpleNamespace(name="python"), "```py\nprint(2)\n``` <python>print(1)</python>")  # type: ignore[arg-type]
    assert tool is not None and (tool.payload, tool.start) == ("print(2)\n", 0)  # the first call
    assert last_answer_tag("<answer>a</answer> <answer>b") == "a"
    assert last_answer_tag("<answer>a</answer> <answer>b</answer>") == "b"
    assert last_code_block("```c++\nint x;\n```\n```\nbare\n```") == "bare\n"


# -- linear time: a megabyte of hostile text, each shipped parser ---------------------------------------
_MB = 1 << 20
_HOSTILE_CHILD = textwrap.dedent(
    f"""
    import time
    from types import SimpleNamespace
    from gem_core.envs.terminal.env import parse_action
    from gem_core.grading.code import last_code_block
    from gem_core.grading.qa import last_answer_tag
    from gem_core.tools.mcp import MCPTool
    from gem_core.tools.python import PythonTool
    from gem_core.tools.search import SearchTool
    import gem_core

    N = {_MB}
    retail = gem_core.make("multiagent:Retail-v0")
    retail.reset(seed=0)
    cases = [
        ("terminal <bash>", lambda: parse_action("<bash>" * (N // 6))),
        ("terminal fence spaces", lambda: parse_action("``` " + " " * N + "x")),
        ("python <python>", lambda: PythonTool.find_call(SimpleNamespace(name="python"), "<python>" * (N // 8))),
        ("python fence spaces", lambda: PythonTool.find_call(SimpleNamespace(name="python"), "```" + " " * N + "x")),
        ("search <search>", lambda: SearchTool.find_call(SimpleNamespace(name="search"), "<search>" * (N // 8))),
        ("mcp <tool_call>", lambda: MCPTool.find_call(SimpleNamespace(name="mcp"), "<tool_call>" * (N // 11))),
        ("qa <answer>", lambda: last_answer_tag("<answer>" * (N // 8))),
        ("code fence spaces", lambda: last_code_block("``` " + " " * N + "x")),
        ("code fence words", lambda: last_code_block("```" + "a" * N + " x")),
        ("retail <tool_call>", lambda: retail.step("<tool_call>" * (N // 11))),
    ]
    for name, parse in cases:
        started = time.process_time()
        parse()
        print(name, time.process_time() - started, flush=True)
    """
)


def test_every_action_parser_is_linear_on_a_megabyte_of_hostile_text() -> None:
    # The old regexes took minutes on each of these inputs (64 KB of "<bash>" took 2 s, x4 per doubling);
    # the finders take milliseconds. The timeout is only a hang guard; the bound is CPU seconds, 100x room.
    child = subprocess.run([sys.executable, "-c", _HOSTILE_CHILD], capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stderr[-2000:]
    cpu = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in child.stdout.splitlines()}
    assert len(cpu) == 10, child.stdout
    slow = {name: seconds for name, seconds in cpu.items() if seconds > 5.0}
    assert not slow, f"parsers that took CPU seconds on 1 MB: {slow}"


@pytest.mark.parametrize("opened", ["<bash>", "```bash\n"])
def test_unclosed_blocks_are_not_commands(opened: str) -> None:
    from gem_core.envs.terminal.env import parse_action

    assert parse_action(opened * 1000)[0] == "error"


_OLD_USER_TURN = re.compile(r"<\|im_start\|>(?:user|tool)\n(.*?)<\|im_end\|>", re.DOTALL)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "user\n", "tool\n", "assistant\n", "user", "x", "\n"]), max_size=14).map("".join))
def test_the_golden_policy_reads_the_same_user_turns(text: str) -> None:
    from gem_core.testing.golden import _user_turns

    assert _user_turns(text) == _OLD_USER_TURN.findall(text)
