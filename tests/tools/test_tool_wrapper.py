"""ToolEnvWrapper: instructions, tool turns, budgets, rewards, the tool-call-and-answer rule, state."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import pytest

import gem_core
from gem_core.core import Env
from gem_core.tools.base import Tool, ToolCall, ToolResult, first_match
from gem_core.wrappers import EpisodeStatistics, ToolEnvWrapper


class AnswerEnv(Env[str, str]):
    """Wins on \\boxed{7}; any other action is a wrong answer. Counts how often it was stepped."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return "What is 3 + 4? Answer in \\boxed{}.", {"suffix": "Your answer."}

    def step(self, action: str):
        self.steps += 1
        won = "\\boxed{7}" in action
        return ("Correct!" if won else "Wrong."), (1.0 if won else 0.0), won, False, {"success": won, "seen": action}


class EchoTool(Tool):
    """<echo>text</echo> -> the text upper-cased; <echo>fail</echo> fails."""

    name = "echo"
    pattern: ClassVar[list[re.Pattern[str]]] = [re.compile(r"<echo>(.*?)</echo>", re.DOTALL)]

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closed = False

    def instructions(self) -> str:
        return "Use <echo>text</echo> to shout."

    def find_call(self, action: str) -> ToolCall | None:
        return first_match(self.pattern, action, self.name)

    def run(self, call: ToolCall) -> ToolResult:
        self.calls.append(call.payload)
        if call.payload == "fail":
            return ToolResult("echo failed", ok=False)
        return ToolResult(call.payload.upper(), ok=True, info={"length": len(call.payload)})

    def close(self) -> None:
        self.closed = True


class CountTool(EchoTool):
    name = "count"
    pattern: ClassVar[list[re.Pattern[str]]] = [re.compile(r"<count>(.*?)</count>", re.DOTALL)]

    def instructions(self) -> str:
        return "Use <count>text</count> to count characters."

    def run(self, call: ToolCall) -> ToolResult:
        self.calls.append(call.payload)
        return ToolResult(str(len(call.payload)), ok=True)


def make(**kwargs: Any) -> tuple[ToolEnvWrapper, EchoTool]:
    tool = EchoTool()
    return ToolEnvWrapper(AnswerEnv(), [tool], **kwargs), tool


def test_reset_adds_instructions_and_zero_counters():
    env, _ = make()
    obs, info = env.reset(seed=0)
    assert obs == "What is 3 + 4? Answer in \\boxed{}.\n\nUse <echo>text</echo> to shout."
    assert info["tool_calls"] == 0 and info["tool_successes"] == 0 and info["tool_turn"] is False
    assert info["suffix"] == "Your answer."  # the inner env's info is kept


def test_tool_turn_returns_the_result_and_does_not_step_the_env():
    env, tool = make(tool_call_reward=0.1, tool_success_reward=0.05)
    env.reset()
    obs, reward, terminated, truncated, info = env.step("let me check <echo>hi</echo>")
    assert obs == "HI" and reward == pytest.approx(0.15) and not terminated and not truncated
    assert env.unwrapped.steps == 0 and tool.calls == ["hi"]
    assert info["tool_turn"] and info["tool"] == "echo" and info["tool_ok"] and info["tool_info"] == {"length": 2}
    assert info["tool_calls"] == 1 and info["tool_successes"] == 1 and info["tool_calls_left"] == 9
    _, reward, *_, info = env.step("<echo>fail</echo>")
    assert reward == pytest.approx(0.1) and not info["tool_ok"] and info["tool_successes"] == 1


def test_plain_action_steps_the_env_with_counters_in_info():
    env, _ = make()
    env.reset()
    env.step("<echo>a</echo>")
    obs, reward, terminated, _, info = env.step("\\boxed{7}")
    assert obs == "Correct!" and reward == 1.0 and terminated
    assert info["tool_turn"] is False and info["tool_calls"] == 1 and info["success"]


def test_tool_call_first_then_answer_runs_the_tool_and_drops_the_rest():
    env, _ = make()
    env.reset()
    action = "<echo>check</echo> so the answer is \\boxed{7}"
    obs, reward, terminated, _, info = env.step(action)
    assert obs == "CHECK" and not terminated and reward == 0.0
    assert info["parsed_action"] == "<echo>check</echo>" and info["dropped_text"] is True
    assert env.unwrapped.steps == 0


def test_answer_first_then_tool_call_submits_the_answer():
    env, tool = make()
    env.reset()
    obs, _, terminated, _, info = env.step("\\boxed{7} and also <echo>late</echo>")
    assert obs == "Correct!" and terminated and info["tool_call_ignored"] is True
    assert tool.calls == [] and env.unwrapped.steps == 1


def test_answer_pattern_none_always_runs_the_tool():
    env, tool = make(answer_pattern=None)
    env.reset()
    env.step("\\boxed{7} <echo>x</echo>")
    assert tool.calls == ["x"]


def test_budget_note_then_calls_go_to_the_env():
    env, tool = make(max_tool_calls=2)
    env.reset()
    first, *_ = env.step("<echo>a</echo>")
    second, *_, info = env.step("<echo>b</echo>")
    assert "[You have used all 2 tool calls" not in first and "[You have used all 2 tool calls" in second
    assert info["tool_calls_left"] == 0
    obs, _, _, _, info = env.step("<echo>c</echo>")
    assert obs == "Wrong." and info["tool_budget_spent"] and tool.calls == ["a", "b"]
    assert env.unwrapped.steps == 1
    env.reset()  # a new episode has a new budget
    assert env.step("<echo>d</echo>")[0] == "D"


def test_zero_budget_and_unlimited_budget():
    env, tool = make(max_tool_calls=0)
    env.reset()
    assert env.step("<echo>a</echo>")[0] == "Wrong." and tool.calls == []
    env, tool = make(max_tool_calls=None)
    env.reset()
    for i in range(30):
        env.step(f"<echo>{i}</echo>")
    assert len(tool.calls) == 30 and env.step("<echo>x</echo>")[4]["tool_calls_left"] is None


def test_earliest_call_among_several_tools_wins_and_instructions_list_all():
    echo, count = EchoTool(), CountTool()
    env = ToolEnvWrapper(AnswerEnv(), [echo, count])
    obs, _ = env.reset()
    assert obs.count("Tools available:") == 1 and "<echo>" in obs and "<count>" in obs
    obs, *_, info = env.step("<count>abcd</count> <echo>x</echo>")
    assert obs == "4" and info["tool"] == "count" and echo.calls == []
    obs, *_, info = env.step("<echo>y</echo> <count>abcd</count>")
    assert obs == "Y" and info["tool"] == "echo"


def test_state_clone_and_close_share_tools_and_carry_counters():
    env, tool = make()
    env.reset()
    env.step("<echo>a</echo>")
    state = env.get_state()
    env.step("<echo>b</echo>")
    env.set_state(state)
    assert env.step("<echo>c</echo>")[4]["tool_calls"] == 2
    twin = env.clone()
    assert isinstance(twin, ToolEnvWrapper) and twin.tools[0] is tool and twin.env is not env.env
    assert twin.step("<echo>d</echo>")[4]["tool_calls"] == 3 and env.step("<echo>e</echo>")[4]["tool_calls"] == 3
    twin.close()
    assert not tool.closed  # a clone does not close the shared tools
    env.close()
    assert tool.closed


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one tool"):
        ToolEnvWrapper(AnswerEnv(), [])
    with pytest.raises(ValueError, match="distinct"):
        ToolEnvWrapper(AnswerEnv(), [EchoTool(), EchoTool()])
    with pytest.raises(ValueError, match="max_tool_calls"):
        ToolEnvWrapper(AnswerEnv(), [EchoTool()], max_tool_calls=-1)


def test_composes_with_episode_statistics_and_a_registered_game():
    env = EpisodeStatistics(ToolEnvWrapper(gem_core.make("game:GuessTheNumber-v0"), [EchoTool()]))
    obs, _ = env.reset(seed=3)
    assert "<echo>" in obs
    _, _, terminated, truncated, info = env.step("<echo>thinking</echo>")
    assert info["tool_turn"] and not (terminated or truncated)
    for guess in range(1, 100):
        _, _, terminated, truncated, info = env.step(f"\\boxed{{{guess}}}")
        if terminated or truncated:
            break
    assert "episode" in info and info["tool_calls"] == 1


def test_with_the_real_python_tool(sandbox):
    from gem_core.tools.python import PythonTool

    env = ToolEnvWrapper(AnswerEnv(), [PythonTool(sandbox=sandbox)], tool_success_reward=0.1)
    obs, _ = env.reset()
    assert "<python>" in obs
    obs, reward, terminated, _, info = env.step("<python>print(3 + 4)</python>")
    assert obs == "<output>\n7\n</output>" and reward == pytest.approx(0.1) and not terminated
    assert info["tool"] == "python" and info["tool_info"]["exit_code"] == 0
    obs, reward, terminated, _, _ = env.step("The tool says 7, so \\boxed{7}")
    assert terminated and reward == 1.0
    env.close()
    assert sandbox.run("print(1)").ok  # a sandbox passed in is not closed with the env


def test_a_failing_tool_is_an_error_turn_not_an_exception():
    from gem_core.errors import GemError

    class BrokenTool(EchoTool):
        def run(self, call: ToolCall) -> ToolResult:
            raise GemError("backend gone")

    env = ToolEnvWrapper(AnswerEnv(), [BrokenTool()])
    env.reset()
    obs, _, terminated, _, info = env.step("<echo>x</echo>")
    assert "unavailable: backend gone" in obs and not info["tool_ok"] and not terminated
    assert info["tool_info"] == {"tool_error": "backend gone", "infra_error": "echo tool: backend gone"} and info["tool_calls"] == 1
    assert info["infra_error"] == "echo tool: backend gone"  # the tool's machinery, not the policy: kept out of training
