"""ToolEnvWrapper: lets the model call tools (Python, search, MCP) between its answers.

An action that holds a tool call is a *tool turn*: the tool runs, its result is the next
observation, and the inner env is not stepped. Any other action goes to the env unchanged.

The rule for an action that holds both a tool call and a final answer (``answer_pattern``, by
default ``\\boxed{`` or ``<answer>``): **whatever comes first wins.**

* The tool call starts first: the tool runs and everything after the call's end is dropped,
  the answer included -- the model wrote it before it could see the tool's result.
  ``info["parsed_action"]`` is the action up to the end of the call, and
  ``info["dropped_text"]`` says whether anything was cut.
* The answer starts first: the action goes to the env as the answer; the later tool call is not
  run (``info["tool_call_ignored"] = True``).

A tool whose machinery fails (a gem_core error, e.g. a sandbox that lost all its workers) gives an
``ok=False`` tool turn that says so; the env never sees an exception from a tool.

Tool calls past ``max_tool_calls`` in an episode are not run: the action goes to the env as it is
(which then judges it, e.g. as a format error if it holds no answer). The observation of the last
allowed tool call says that the budget is spent.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Sequence
from typing import Any

from gem_core.core import Env, StepResult, Wrapper
from gem_core.errors import INFRA_ERROR, GemError, infra_error
from gem_core.tools.base import Tool, ToolCall, ToolResult

logger = logging.getLogger(__name__)

DEFAULT_ANSWER_PATTERN = r"\\boxed\s*\{|<answer>"
_BUDGET_NOTE = "\n\n[You have used all {n} tool calls of this episode. Give your final answer now.]"


class ToolEnvWrapper(Wrapper[str, str]):
    """Adds tools to a text env.

    * ``reset``: the tools' instructions are appended to the first observation (after a blank line).
    * ``step``: a tool call (the earliest one among ``tools``) is run; its observation is returned with
      reward ``tool_call_reward`` (+ ``tool_success_reward`` when it succeeded), ``terminated`` and
      ``truncated`` false. Other actions step the inner env.
    * ``info`` on every step: ``tool_turn`` (bool), ``tool_calls`` and ``tool_successes`` (this episode's
      counts so far), ``tool_calls_left``; on a tool turn also ``tool`` (its name), ``tool_ok``,
      ``tool_info`` and ``parsed_action``. When the episode ends, ``info["tool_calls"]`` is its total.

    Tools are shared, not copied, by ``clone``/``get_state``: the state is the counters only.
    """

    def __init__(
        self,
        env: Env,
        tools: Sequence[Tool],
        *,
        max_tool_calls: int | None = 10,
        tool_call_reward: float = 0.0,
        tool_success_reward: float = 0.0,
        answer_pattern: str | None = DEFAULT_ANSWER_PATTERN,
        close_tools: bool = True,
    ):
        super().__init__(env)
        if not tools:
            raise ValueError("ToolEnvWrapper needs at least one tool")
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be distinct, got {names}")
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0 or None (no limit), got {max_tool_calls}")
        self.tools = list(tools)
        self.max_tool_calls = max_tool_calls
        self.tool_call_reward = float(tool_call_reward)
        self.tool_success_reward = float(tool_success_reward)
        self.answer_pattern = re.compile(answer_pattern) if answer_pattern else None
        self.close_tools = close_tools
        # Private names: public ones would shadow same-named attributes of the inner env.
        self._tool_calls = 0
        self._tool_successes = 0

    # -- the API ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the inner env and the counters; the tools' instructions follow the first observation."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._tool_calls = 0
        self._tool_successes = 0
        instructions = "\n\n".join(tool.instructions() for tool in self.tools)
        if len(self.tools) > 1:
            instructions = "Tools available:\n\n" + instructions
        info = {**info, **self._counters(), "tool_turn": False}
        return f"{obs}\n\n{instructions}", info

    def step(self, action: str) -> StepResult:
        """Run the action's tool call, or step the inner env (the rule is in the module docstring)."""
        call = self.find_tool_call(action) if isinstance(action, str) else None
        answer_at = self._answer_start(action) if call is not None else None
        ignored = call is not None and answer_at is not None and answer_at < call.start
        budget_left = self.max_tool_calls is None or self._tool_calls < self.max_tool_calls
        if call is None or ignored or not budget_left:
            obs, reward, terminated, truncated, info = self.env.step(action)
            info = {**info, **self._counters(), "tool_turn": False}
            if ignored:
                info["tool_call_ignored"] = True
            elif call is not None:
                info["tool_budget_spent"] = True
            return obs, reward, terminated, truncated, info
        return self._tool_turn(action, call)

    def _tool_turn(self, action: str, call: ToolCall) -> StepResult:
        tool = next(t for t in self.tools if t.name == call.tool)
        try:
            result = tool.run(call)
        except GemError as exc:  # the tool's machinery failed (e.g. a sandbox that lost every worker)
            logger.warning("tool %r failed: %s", tool.name, exc)
            result = ToolResult(
                f"[the {tool.name} tool is unavailable: {exc}]",
                ok=False,
                info={"tool_error": str(exc), INFRA_ERROR: f"{tool.name} tool: {exc}"},
            )
        self._tool_calls += 1
        self._tool_successes += bool(result.ok)
        reward = self.tool_call_reward + (self.tool_success_reward if result.ok else 0.0)
        obs = result.observation
        if self.max_tool_calls is not None and self._tool_calls == self.max_tool_calls:
            obs += _BUDGET_NOTE.format(n=self.max_tool_calls)
        info = {
            **self._counters(),
            "tool_turn": True,
            "tool": tool.name,
            "tool_ok": bool(result.ok),
            "tool_info": result.info,
            "parsed_action": action[: call.end],
            "dropped_text": bool(action[call.end :].strip()),
        }
        failure = infra_error(result.info)  # the tool's machinery failed: not the policy's doing
        if failure is not None:
            info[INFRA_ERROR] = failure
        return obs, reward, False, False, info

    def find_tool_call(self, action: str) -> ToolCall | None:
        """The call that starts first among all tools, or ``None``."""
        best: ToolCall | None = None
        for tool in self.tools:
            call = tool.find_call(action)
            if call is not None and (best is None or call.start < best.start):
                best = call
        return best

    def _answer_start(self, action: str) -> int | None:
        if self.answer_pattern is None:
            return None
        match = self.answer_pattern.search(action)
        return match.start() if match else None

    def _counters(self) -> dict[str, Any]:
        left = None if self.max_tool_calls is None else self.max_tool_calls - self._tool_calls
        return {"tool_calls": self._tool_calls, "tool_successes": self._tool_successes, "tool_calls_left": left}

    # -- state: counters only; the tools are shared ------------------------------------------------
    def get_state(self) -> Any:
        """The counters and the inner env's state (tools hold processes and sessions: not state)."""
        return {"tool_calls": self._tool_calls, "tool_successes": self._tool_successes, "env": self.env.get_state()}

    def set_state(self, state: Any) -> None:
        self._tool_calls = state["tool_calls"]
        self._tool_successes = state["tool_successes"]
        self.env.set_state(state["env"])

    def clone(self) -> Env:
        """A copy with its own inner env and counters, sharing the tools (closing it does not close them)."""
        new = copy.copy(self)
        new.env = self.env.clone()
        new.close_tools = False
        return new

    def close(self) -> None:
        """Close the inner env, and the tools unless ``close_tools=False``."""
        if self.close_tools:
            for tool in self.tools:
                tool.close()
        self.env.close()
