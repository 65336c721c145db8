"""The GEM agent file for OpenRLHF 0.11.x: pass its path as ``--train.agent_func_path``.

    --train.agent_func_path $(gem-core openrlhf agent-path)

OpenRLHF loads this file by path (``_load_agent_executor``) and calls ``AgentExecutor().execute(...)``
once per sample. ``AgentExecutor`` is OpenRLHF's own ``MultiTurnAgentExecutor`` driving
:class:`GemAgentInstance`; the only thing added is binding the rollout's tokenizer and ``max_len`` to
the instance class (OpenRLHF builds instances with no arguments).

Each sample's env comes from its prompt row's label, a JSON object (``gem-core make-dataset openrlhf``
writes it): ``{"env_id": ..., "seed": ..., "env_kwargs": {...}}``, optionally ``"system_prompt"`` and
``"max_turns"``. Every sample of a prompt has the same label, so all of them start from the same state.
The row's prompt text is not used: ``reset`` returns the env's own first observation, rendered by
gem_core's :class:`~gem_core.rollout.ChatFormatter` (chat template, generation prompt). Each step's
``environment_feedback`` is the formatter's chat-template delta (closing of the assistant turn when the
model did not generate it, the observation turn, the generation prompt), so the token sequence is the
one gem_core's runner builds. The episode ends with no feedback when the env ends it, when
``max_turns`` is reached, or when the next observation would not fit in ``max_len`` (``context_limit``,
as gem_core's runner does): the final observation is never shown to the model.

Requirements: OpenRLHF's ``skip_special_tokens`` must stay false (its default), since whether a
response closed its turn is read from its text. ``extra_logs`` carries, with the same keys on every
sample, ``gem_episode_length``, ``gem_success``, ``gem_truncated`` and ``gem_context_limit``; when
``GEM_OPENRLHF_TURN_REWARDS=1`` (the ``gem-core openrlhf train`` launcher sets it) also
``gem_turn_rewards``, the list of per-turn rewards that the ``rebn`` advantage patch consumes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from gem_core import model_message
from gem_core.rollout import ChatFormatter, ThreadedEnv
from gem_core.tasks import make_task_env

TURN_REWARDS_KEY = "gem_turn_rewards"
TURN_REWARDS_ENV = "GEM_OPENRLHF_TURN_REWARDS"
LOG_KEYS = ("gem_episode_length", "gem_success", "gem_truncated", "gem_context_limit")

_formatters: dict[tuple[int, str | None], ChatFormatter] = {}
_bound_classes: dict[tuple[int, int], type] = {}


def parse_label(label: Any) -> dict[str, Any]:
    """The env spec of a prompt row: ``{"env_id", "seed", "env_kwargs", "tools", ...}`` from the label JSON."""
    spec = json.loads(label) if isinstance(label, str) else dict(label or {})
    if not isinstance(spec, dict) or "env_id" not in spec:
        raise ValueError(
            "the GEM agent needs each prompt row's label to be a JSON object with an 'env_id' "
            f"(write the dataset with `gem-core make-dataset openrlhf`); got {label!r:.200}"
        )
    unknown = set(spec) - {"env_id", "seed", "env_kwargs", "tools", "system_prompt", "max_turns"}
    if unknown:
        raise ValueError(f"unknown keys in the GEM label: {sorted(unknown)}")
    return spec


def formatter_for(tokenizer: Any, system_prompt: str | None = None) -> ChatFormatter:
    """One :class:`ChatFormatter` per (tokenizer, system prompt), built once per process."""
    key = (id(tokenizer), system_prompt)
    formatter = _formatters.get(key)
    if formatter is None or formatter.tokenizer is not tokenizer:
        formatter = _formatters[key] = ChatFormatter(tokenizer, system_prompt=system_prompt)
    return formatter


class GemAgentInstance(AgentInstanceBase):
    """One GEM episode as an OpenRLHF agent instance. ``tokenizer``/``max_length`` are class attributes,
    set by :class:`AgentExecutor` on a per-rollout subclass."""

    tokenizer: Any = None
    max_length: int | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        if self.tokenizer is None:
            raise TypeError("GemAgentInstance needs a tokenizer: use it through gem's AgentExecutor")
        self.env: ThreadedEnv | None = None
        self.formatter: ChatFormatter | None = None
        self.context_len = 0
        self.rewards: list[float] = []
        self.max_turns: int | None = None
        self.truncated = False
        self.context_limit = False
        self.success = False

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        spec = parse_label(states.get("label"))
        self.formatter = formatter_for(self.tokenizer, spec.get("system_prompt"))
        self.max_turns = spec.get("max_turns")
        self.env = ThreadedEnv(make_task_env(spec["env_id"], spec.get("env_kwargs"), spec.get("tools")))
        observation, info = await self.env.reset(seed=spec.get("seed"))
        if not isinstance(observation, str):
            raise TypeError(f"{spec['env_id']} returned a {type(observation).__name__} observation; the agent needs text")
        prompt = self.formatter.prompt_text(model_message(observation, info))
        self.context_len = len(self.formatter.encode(prompt))
        return {"observation": prompt}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        formatter, env = self.formatter, self.env
        if formatter is None or env is None:
            raise RuntimeError("step() before reset()")
        if getattr(states.get("sampling_params"), "skip_special_tokens", False):
            raise ValueError(
                "the GEM agent reads the end-of-turn token from the response text: keep OpenRLHF's "
                "skip_special_tokens false (its default)"
            )
        response = states["action_text"]
        response_ids = formatter.encode(response)  # counts tokens and drops special-token text
        action = formatter.action_text(formatter.response_text(response_ids))
        observation, reward, terminated, truncated, info = await env.step(action)
        self.rewards.append(float(reward))
        self.context_len += len(response_ids)
        self.success = bool(info.get("success", False))
        done = bool(terminated or truncated)
        self.truncated = bool(truncated and not terminated)
        if not done and self.max_turns is not None and len(self.rewards) >= self.max_turns:
            done, self.truncated = True, True
        feedback = ""
        if not done:
            if not isinstance(observation, str):
                raise TypeError(f"the env returned a {type(observation).__name__} observation; the agent needs text")
            role = "tool" if (info.get("tool_turn") or info.get("use_tool")) else "user"
            closed = self._closed(response)
            feedback = formatter.observation_text(model_message(observation, info), closed, role)
            delta = len(formatter.encode(feedback))
            if self.max_length is not None and self.context_len + delta + 1 > self.max_length:
                feedback, done, self.truncated, self.context_limit = "", True, True, True
            else:
                self.context_len += delta
        if done:
            env.env.close()
        return {
            "rewards": torch.tensor(float(reward)),
            "environment_feedback": feedback,
            "done": done,
            "extra_logs": self.extra_logs(),
        }

    def extra_logs(self) -> dict[str, Any]:
        """Episode statistics, the same keys on every sample (plus the per-turn rewards when asked)."""
        logs: dict[str, Any] = {
            "gem_episode_length": len(self.rewards),
            "gem_success": float(self.success),
            "gem_truncated": float(self.truncated),
            "gem_context_limit": float(self.context_limit),
        }
        if os.environ.get(TURN_REWARDS_ENV) == "1":
            logs[TURN_REWARDS_KEY] = list(self.rewards)
        return logs

    def _closed(self, response: str) -> bool:
        """Whether the response text ends with the template's end-of-turn token."""
        formatter = self.formatter
        if formatter.end_of_turn_id is None:
            return False
        return response.endswith(formatter.decode([formatter.end_of_turn_id]))


def bound_instance_class(tokenizer: Any, max_length: int | None) -> type:
    """A :class:`GemAgentInstance` subclass carrying the rollout's tokenizer and max length."""
    key = (id(tokenizer), max_length)
    cls = _bound_classes.get(key)
    if cls is None or cls.tokenizer is not tokenizer:
        cls = type("BoundGemAgentInstance", (GemAgentInstance,), {"tokenizer": tokenizer, "max_length": max_length})
        _bound_classes[key] = cls
    return cls


class AgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's ``MultiTurnAgentExecutor`` over :class:`GemAgentInstance`."""

    def __init__(self) -> None:
        super().__init__(GemAgentInstance)

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        runner = MultiTurnAgentExecutor(bound_instance_class(hf_tokenizer, max_length))
        return await runner.execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
