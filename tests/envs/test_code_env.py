"""Code envs: the last fenced block against the problem's tests in the shared sandbox -- correct, wrong,
crashing, hanging and output-flooding solutions; stdin/stdout and function-call styles; partial credit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets", reason="dataset envs need the tasks extra")
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))

from sandbox_support import require_bwrap  # noqa: E402

import gem_core  # noqa: E402
from gem_core.envs.code_data import PROBLEMS, code_rows  # noqa: E402
from gem_core.grading.code import last_code_block  # noqa: E402


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    require_bwrap()
    path = tmp_path_factory.mktemp("code") / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in code_rows()))
    return str(path)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def play(env, idx, response):
    env.reset(options={"idx": idx})
    return env.step(response)


def test_reference_solutions_pass_both_styles(problems):
    env = gem_core.make("code:Taco8k", data_files=problems)
    try:
        for idx, problem in enumerate(PROBLEMS):
            _obs, reward, terminated, _tr, info = play(env, idx, fenced(problem["solution"]))
            assert (reward, terminated, info["passed"], info["total"]) == (1.0, True, 3, 3), (idx, info)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        ("a, b = map(int, input().split())\nprint(a - b)", "wrong answer"),
        ("raise SystemExit(3)", "runtime error"),
        ("import time\ntime.sleep(30)", "time limit"),
        ("while True:\n    print('x' * 1000)", "output limit"),
    ],
    ids=["wrong", "crashing", "hanging", "flooding"],
)
def test_bad_solutions_fail_with_the_failing_case_in_info(problems, code, verdict):
    env = gem_core.make("code:CodeContest", data_files=problems, time_limit=1.0)
    try:
        observation, reward, _t, _tr, info = play(env, 0, fenced(code))
        assert reward == 0.0 and not info["correct"] and not info["format_error"]
        assert info["failure"]["verdict"] == verdict
        assert verdict in observation and len(observation) < 1000
    finally:
        env.close()


def test_partial_credit_and_format_errors(problems):
    env = gem_core.make("code:PrimeIntellect15k", data_files=problems, partial_credit=True)
    try:
        # right for "1 2" and "-5 5" only
        code = "a, b = map(int, input().split())\nprint(a + b if abs(a + b) < 10 else 0)"
        _obs, reward, *_rest, info = play(env, 0, fenced(code))
        assert reward == pytest.approx(2 / 3) and info["passed"] == 2
        _obs, reward, *_rest, info = play(env, 0, "print(3)")
        assert reward == 0.0 and info["format_error"]
        _obs, reward, *_rest, info = play(env, 3, fenced("def add(a, b):\n    return a + b if a < 5 else 0"))
        assert info["passed"] == 2 and info["failure"]["verdict"] == "wrong answer"
    finally:
        env.close()


def test_the_last_fenced_block_counts():
    assert last_code_block("```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```") == "print(2)\n"
    assert last_code_block("```\nprint(3)\n```") == "print(3)\n"
    assert last_code_block("no code") is None and last_code_block(None) is None


def test_eval_code_contest_in_order(problems):
    env = gem_core.make("eval:CodeContest", data_files=problems)
    assert len(env) == len(PROBLEMS)
    assert [env.reset()[1]["idx"] for _ in range(3)] == [0, 1, 2]
    env.close()
