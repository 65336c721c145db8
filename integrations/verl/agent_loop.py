"""The ``gem_env`` agent loop: a GEM environment episode as one verl agent-loop sample.

A dataset row names the env (``env_id``, ``env_seed``, ``env_kwargs`` as JSON, optional ``env_tools``,
``max_turns``, ``max_turn_tokens`` (per response; default ``rollout.response_length``),
``max_context_tokens``, ``system_prompt``; ``gem-core make-dataset verl`` writes them). The whole
response (all turns and observations) is kept within ``rollout.response_length``. The
loop makes the env, plays it with :func:`gem_core.rollout.run_episode` using verl's server manager as the
policy (token in, token out), and returns the episode's sequence view: the prompt, every turn's response
followed by the template/observation tokens (``response_mask`` 1 on model tokens, 0 on env tokens), the
rollout logprobs and the rewards.

Rewards: ``reward_score`` is the episode return, so verl's reward loop is not asked for a score; the
per-turn rewards are written into ``rm_scores`` at each turn's last model token by
:meth:`GemAgentLoopOutput.as_dict`, the method verl 0.9's v1 trainer (``trainer.use_v1=True``, the default)
calls to store a sample. The ``rebn`` estimator reads them back from the runs of the response mask.
The legacy trainer (``use_v1=False``) keeps only a scalar per row, so rebn refuses to run with it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from gem_core import model_message
from gem_core.rollout import ChatFormatter, Generation, RunConfig, SamplingParams, Trajectory, episode_of, run_episode
from gem_core.tasks import make_task_env

from .advantage import ESTIMATORS

AGENT_NAME = "gem_env"


class GemAgentLoopOutput(AgentLoopOutput):
    """verl's AgentLoopOutput plus each turn's reward and the response position it belongs to."""

    turn_rewards: list[float] = []
    turn_reward_positions: list[int] = []

    def as_dict(self) -> dict[str, Any]:
        """verl's dict, with ``rm_scores`` holding every turn's reward (not only the episode's at the end)."""
        import torch

        out = super().as_dict()
        rewards = out.pop("turn_rewards", self.turn_rewards)
        positions = out.pop("turn_reward_positions", self.turn_reward_positions)
        if positions:
            scores = torch.zeros_like(out["response_mask"], dtype=torch.float32)
            scores.index_put_((torch.tensor(positions, dtype=torch.long),), torch.tensor(rewards, dtype=torch.float32), accumulate=True)
            out["rm_scores"] = scores
        return out


class VerlServerPolicy:
    """A gem_core :class:`~gem_core.rollout.Policy` over verl's ``server_manager.generate``.

    ``base_sampling_params``: the dict verl hands the agent loop (temperature, top_p, top_k, logprobs,
    ...); each turn adds ``max_tokens`` and ``stop_token_ids`` (vLLM names, which verl's vLLM and SGLang
    servers both read). Every turn of an episode is sent with the episode id as request id, so verl's
    load balancer keeps the episode on one server (prefix cache).
    """

    def __init__(self, server_manager: Any, base_sampling_params: Mapping[str, Any] | None = None):
        self.server_manager = server_manager
        self.base_sampling_params = dict(base_sampling_params or {})
        self.num_preempted = -1
        self.extra_fields: dict[str, Any] = {}

    def sampling_params(self, params: SamplingParams) -> dict[str, Any]:
        """verl/vLLM sampling params for one turn."""
        out = dict(self.base_sampling_params)
        out.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else -1)
        out["max_tokens"] = params.max_tokens
        if params.stop_token_ids:
            out["stop_token_ids"] = list(params.stop_token_ids)
        out.update(params.extra)
        return out

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        output = await self.server_manager.generate(
            request_id=episode_of(request_id) if request_id else uuid4().hex,
            prompt_ids=list(prompt_ids),
            sampling_params=self.sampling_params(params),
        )
        ids = [int(t) for t in output.token_ids]
        if getattr(output, "num_preempted", None) is not None:
            self.num_preempted = max(self.num_preempted, 0) + int(output.num_preempted)
        self._track_global_steps(getattr(output, "extra_fields", None) or {})
        logprobs = list(output.log_probs) if getattr(output, "log_probs", None) else None
        return Generation(ids, logprobs, _finish_reason(output, ids, params))

    def _track_global_steps(self, extra: Mapping[str, Any]) -> None:
        first, last = extra.get("min_global_steps"), extra.get("max_global_steps")
        if first is not None and "min_global_steps" not in self.extra_fields:
            self.extra_fields["min_global_steps"] = first
        if last is not None:
            self.extra_fields["max_global_steps"] = last


def _finish_reason(output: Any, ids: Sequence[int], params: SamplingParams) -> str:
    """verl's TokenOutput reports only 'completed'/'aborted': a response that used its whole budget
    without ending on a stop token was cut by ``max_tokens``."""
    if getattr(output, "stop_reason", None) == "aborted":
        return "abort"
    if len(ids) >= params.max_tokens and (not ids or ids[-1] not in params.stop_token_ids):
        return "length"
    return "stop"


# ChatFormatter probes the chat template when built; verl builds one agent loop per sample, so cache it.
_FORMATTERS: dict[tuple, ChatFormatter] = {}
_FORMATTERS_LOCK = threading.Lock()


def _formatter(tokenizer: Any, system_prompt: str | None, template_kwargs: Mapping[str, Any]) -> ChatFormatter:
    key = (id(tokenizer), system_prompt, json.dumps(dict(template_kwargs), sort_keys=True, default=str))
    with _FORMATTERS_LOCK:
        formatter = _FORMATTERS.get(key)
        if formatter is None:
            formatter = _FORMATTERS[key] = ChatFormatter(tokenizer, system_prompt=system_prompt, chat_template_kwargs=dict(template_kwargs))
        return formatter


def _plain(value: Any) -> Any:
    """numpy scalars/arrays from verl's non-tensor batch as plain Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def env_from_row(row: Mapping[str, Any]) -> Any:
    """Make the env a dataset row names: ``env_id``, ``env_kwargs`` (dict or JSON) and ``env_tools``
    (``"python"``, ``"search"``: the env wrapped in gem_core's ToolEnvWrapper with those tools)."""
    return make_task_env(_plain(row["env_id"]), _plain(row.get("env_kwargs")), _plain(row.get("env_tools")))


@register(AGENT_NAME)
class GemEnvAgentLoop(AgentLoopBase):
    """Plays one GEM env episode per sample (see the module docstring for the dataset columns)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        trainer = self.config.get("trainer", {}) or {}
        estimator = (self.config.get("algorithm", {}) or {}).get("adv_estimator")
        if estimator in ESTIMATORS and not trainer.get("use_v1", True):
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs per-turn rewards, which only verl's v1 trainer "
                "(trainer.use_v1=True) stores; the legacy trainer keeps one reward per row"
            )

    def make_env(self, row: Mapping[str, Any]) -> Any:
        """The env for a row; override to build envs another way."""
        return env_from_row(row)

    def max_turns(self, row: Mapping[str, Any]) -> int | None:
        value = _plain(row.get("max_turns"))
        if value is None or value == 0:
            value = self.rollout_config.multi_turn.get("max_assistant_turns") if "multi_turn" in self.rollout_config else None
        return int(value) if value else None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = kwargs
        seed = _plain(row.get("env_seed"))
        seed = None if seed is None else int(seed)
        formatter = _formatter(self.tokenizer, _plain(row.get("system_prompt")) or None, self.apply_chat_template_kwargs or {})
        policy = VerlServerPolicy(self.server_manager, sampling_params)
        turn_tokens = _plain(row.get("max_turn_tokens"))
        params = SamplingParams(
            max_tokens=min(int(turn_tokens), self.response_length) if turn_tokens else self.response_length,
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=max(int(sampling_params.get("top_k", -1) or -1), 0),
        )
        env = self.make_env(row)
        try:
            observation, reset_info = env.reset(seed=seed)
            prompt_ids = formatter.prompt_ids(model_message(observation, reset_info))
            if len(prompt_ids) > self.prompt_length:
                raise ValueError(
                    f"{row['env_id']} (seed {seed}): the first observation is {len(prompt_ids)} tokens, more than "
                    f"actor_rollout_ref.rollout.prompt_length={self.prompt_length}"
                )
            # The whole response (every turn and observation) must fit verl's response_length.
            budget = len(prompt_ids) + self.response_length
            row_limit = _plain(row.get("max_context_tokens"))
            max_context = min(budget, int(row_limit)) if row_limit else budget
            trajectory = await run_episode(
                env,
                policy,
                formatter,
                RunConfig(params=params, max_turns=self.max_turns(row), max_context_tokens=max_context),
                seed=seed,
                observation=observation,
                reset_info=reset_info,
                episode_id=_plain(row.get("episode_id")) or uuid4().hex,
                group_id=str(_plain(row.get("uid")) or "") or None,
                env_id=str(row["env_id"]),
            )
        finally:
            env.close()
        return self.to_output(trajectory, policy)

    def to_output(self, trajectory: Trajectory, policy: VerlServerPolicy | None = None) -> GemAgentLoopOutput:
        """The trajectory's sequence view as verl's AgentLoopOutput (with per-turn rewards)."""
        extra = {
            "turn_scores": trajectory.rewards,
            "gem_env_id": trajectory.env_id,
            "gem_terminated": trajectory.terminated,
            "gem_truncation_reason": trajectory.truncation_reason,
            **(policy.extra_fields if policy is not None else {}),
        }
        metrics = AgentLoopMetrics(num_preempted=policy.num_preempted if policy is not None else -1)
        if not trajectory.turns:  # aborted before the first response: one masked token, no reward
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            return GemAgentLoopOutput(
                prompt_ids=trajectory.prompt_ids, response_ids=[pad], response_mask=[0], reward_score=0.0,
                num_turns=1, metrics=metrics, extra_fields=extra,
            )
        view = trajectory.as_sequence()
        return GemAgentLoopOutput(
            prompt_ids=view.prompt_ids,
            response_ids=view.response_ids,
            response_mask=view.loss_mask,
            response_logprobs=view.logprobs,
            reward_score=trajectory.episode_return,
            num_turns=2 * len(trajectory.turns),
            metrics=metrics,
            extra_fields=extra,
            turn_rewards=view.rewards,
            turn_reward_positions=view.reward_positions,
        )
