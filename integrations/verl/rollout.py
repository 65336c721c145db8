"""The ``gem_env`` agent loop: a GEM environment episode as one verl agent-loop sample.

A dataset row is a :class:`gem_core.tasks.TaskSpec` in columns (``env_id``, ``env_seed``, ``env_kwargs``
as JSON, ``env_tools``, ``max_turns``, ``max_turn_tokens`` (per response; default
``rollout.response_length``), ``max_context_tokens``, ``system_prompt``; ``gem-core make-dataset verl``
writes them). The whole response (all turns and observations) is kept within ``rollout.response_length``.
The loop makes the env, plays it with :func:`gem_core.rollout.play_row` using verl's server manager as
the policy (:class:`VerlServerPolicy`, token in, token out), and returns the episode's sequence view: the
prompt, every turn's response followed by the template/observation tokens (``response_mask`` 1 on model
tokens, 0 on env tokens), the rollout logprobs, the rewards and each token's turn id.

The first prompt longer than ``rollout.prompt_length`` is left-truncated, as verl's own loops do
(``AgentLoopBase._cap_text_prompt_length``: a warning, the last ``prompt_length`` tokens kept).

Rewards: ``reward_score`` is the episode return, so verl's reward loop is not asked for a score; the
per-turn rewards are written into ``rm_scores`` at each turn's last model token, and the per-token turn
ids into :data:`~gem_integrations.verl.advantage.TURN_IDS_FIELD`, by :meth:`GemAgentLoopOutput.as_dict`,
the method verl 0.9's v1 trainer (``trainer.use_v1=True``, the default) calls to store a sample in
TransferQueue. The ``rebn`` estimator gets both (see :mod:`gem_integrations.verl.advantage`).
An episode the infrastructure failed (``Trajectory.infra_error``: verl's server aborted the request, a
sandbox or env worker died) keeps its tokens but gets ``response_mask`` 0, ``rm_scores`` 0 and turn ids
-1 (gem_core's :func:`~gem_core.batch.sequence_batch` rule), and its reason in :data:`INFRA_FIELD`, which
the advantage step counts in the step's metrics; it is neither trained on nor part of ReBN's statistics.
The legacy trainer (``use_v1=False``) keeps only a scalar per row, and a reward model would overwrite
or skip the per-turn scores: with the gem estimators both are refused
(:func:`~gem_integrations.verl.advantage.check_trainer_config`).

Images (vision-language models): when verl hands the loop a multimodal processor (``actor_rollout_ref.model.path``
names a VL model verl supports), the loop renders through :class:`~gem_core.rollout.VLChatFormatter` over
it, the processor's chat template for every row (as verl's own VL token builder does), so an env whose
observations carry images (``vision:Geometry-v0``) is played with each image expanded by the processor.
Every request sends the context's images as ``image_data`` (:class:`VerlServerPolicy`), and the output
carries them as ``multi_modal_data={"images": [...]}``, from which verl builds the actor's
``multi_modal_inputs`` (``pixel_values``, ...). ``data.mm_processor_kwargs`` (e.g. Qwen-VL's
``max_pixels``) is used as verl's own loops use it (``AgentLoopBase.mm_processor_kwargs``): in every
processor call of the formatter (so the sequence holds as many image tokens as the features verl rebuilds
with the same kwargs), with every request that carries images, and in the output's ``mm_processor_kwargs``.
The images come from the env (reset with the row's seed), not from the row's ``images`` column (which
verl's dataset reads for its own filtering and logging). A text model (no processor) with an env that
shows images is one clear error; a multimodal first prompt over ``rollout.prompt_length`` is an error too
(verl's rule: image tokens cannot be cut). Two images whose tokens touch stay two in each request (cut by
each image's count), but verl's own ``_compute_multi_modal_inputs`` cuts the sequence by runs before it
rebuilds the features (one placeholder left for the two); verl's supported processors (Qwen-VL, GLM-4V)
wrap every image in start/end tokens, and ``MultimodalObservation`` puts a line break between the
placeholders it adds, so their images never touch.

Metrics (verl's ``AgentLoopMetrics``): ``generate_sequences`` is the time spent waiting for the server,
``tool_calls`` the time spent in the env's steps (tool calls included), summed over the episode. Each row
also carries its outcome in :data:`~gem_integrations.verl.advantage.SUCCESS_FIELD` (the env's ``success``
on the last turn, 1.0 or 0.0), from which the advantage step logs the batch's ``gem/success_rate`` beside
verl's ``critic/score/mean`` (the mean return).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from gem_core.batch import sequence_batch
from gem_core.multimodal import MultimodalObservation, observation_images
from gem_core.plugins import EnginePolicy
from gem_core.rollout import (
    ChatFormatter,
    Generation,
    RunConfig,
    SamplingParams,
    Trajectory,
    VLChatFormatter,
    as_async_env,
    cached_formatter,
    engine_image_prompt,
    episode_of,
    play_row,
)
from gem_core.tasks import TaskSpec

from .advantage import INFRA_FIELD, SUCCESS_FIELD, TURN_IDS_FIELD, check_trainer_config

logger = logging.getLogger(__name__)

AGENT_NAME = "gem_env"


class GemAgentLoopOutput(AgentLoopOutput):
    """verl's AgentLoopOutput plus each response token's reward (each turn's on its last model token),
    each response token's turn id, the infrastructure failure that ended the episode ("" if none) and whether
    the env scored the episode a success."""

    token_rewards: list[float] = []
    turn_ids: list[int] = []
    infra_error: str = ""
    success: bool = False

    def as_dict(self) -> dict[str, Any]:
        """verl's dict, with ``rm_scores`` holding every turn's reward (not only the episode's at the end),
        :data:`TURN_IDS_FIELD` each response token's turn (-1: none), :data:`INFRA_FIELD` the failure and
        :data:`SUCCESS_FIELD` the outcome (1.0 or 0.0)."""
        import torch

        out = super().as_dict()
        rewards = out.pop("token_rewards", self.token_rewards)
        turn_ids = out.pop("turn_ids", self.turn_ids)
        out[INFRA_FIELD] = str(out.pop("infra_error", self.infra_error) or "")
        out[SUCCESS_FIELD] = float(bool(out.pop("success", self.success)))
        if rewards:
            if len(rewards) != out["response_mask"].numel():
                raise ValueError(f"{len(rewards)} token rewards for a response of {out['response_mask'].numel()} tokens")
            out["rm_scores"] = torch.tensor(rewards, dtype=torch.float32)
        if turn_ids:
            out[TURN_IDS_FIELD] = torch.tensor(turn_ids, dtype=torch.int64)
        else:
            out[TURN_IDS_FIELD] = torch.full_like(out["response_mask"], -1, dtype=torch.int64)
        return out


class VerlServerPolicy(EnginePolicy):
    """A gem_core :class:`~gem_core.rollout.Policy` over verl's ``server_manager.generate``.

    ``base_sampling_params``: the dict verl hands the agent loop (temperature, top_p, top_k, logprobs,
    ...); each turn adds ``max_tokens`` and ``stop_token_ids`` (vLLM names, which verl's vLLM and SGLang
    servers both read; :meth:`~gem_core.plugins.EnginePolicy.vllm_params`). Every turn of an episode is
    sent with the episode id as request id, so verl's load balancer keeps the episode on one server
    (prefix cache). ``generate_seconds`` sums the time spent waiting for the server.

    Finish reasons: verl's ``TokenOutput`` reports vLLM's ``stop`` and ``length`` both as
    ``stop_reason="completed"`` (``vllm_async_server.generate``), and verl's server lowers ``max_tokens``
    to what is left of ``max_model_len``. So a completed response that does not end on one of the
    request's stop tokens was cut by a length limit, the requested one or the server's: ``"length"``.

    Images: a request with ``multi_modal_data={"image": [...]}`` (the runner's form) goes to verl's
    server manager with the images as ``image_data``, ``mm_processor_kwargs`` (verl's
    ``data.mm_processor_kwargs``, when set) and each image's tokens of ``image_token_id`` (the processor's
    image token, :attr:`~gem_core.rollout.VLChatFormatter.image_token_id`) cut to one token, by the counts
    ``image_token_counts`` gives (:func:`gem_core.rollout.engine_image_prompt`): vLLM's form, which the
    engine expands per image itself. verl's vLLM server makes that cut only for Qwen2-VL-family
    processors (``qwen2_5_vl_dedup_image_tokens``); for those it changes nothing, for others it keeps the
    image tokens from being expanded twice.
    """

    def __init__(
        self,
        server_manager: Any,
        base_sampling_params: Mapping[str, Any] | None = None,
        image_token_id: int | None = None,
        *,
        image_token_counts: Callable[[Sequence[Any]], list[int]] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ):
        self.server_manager = server_manager
        self.base_sampling_params = dict(base_sampling_params or {})
        self.image_token_id = image_token_id
        self.image_token_counts = image_token_counts
        self.mm_processor_kwargs = dict(mm_processor_kwargs or {})
        self.num_preempted = -1
        self.generate_seconds = 0.0
        self.extra_fields: dict[str, Any] = {}

    def sampling_params(self, params: SamplingParams) -> dict[str, Any]:
        """verl/vLLM sampling params for one turn."""
        return self.vllm_params(params, self.base_sampling_params)

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str, multi_modal_data: dict[str, Any] | None = None) -> Any:
        images = list((multi_modal_data or {}).get("image") or ())
        media: dict[str, Any] = {}
        if images:
            if self.image_token_id is None:
                raise ValueError("VerlServerPolicy got images but knows no image token: pass image_token_id= (the VLChatFormatter's)")
            prompt_ids = engine_image_prompt(prompt_ids, images, self.image_token_id, self.image_token_counts)
            media["image_data"] = images
            if self.mm_processor_kwargs:
                media["mm_processor_kwargs"] = dict(self.mm_processor_kwargs)
        started = time.perf_counter()
        try:
            return await self.server_manager.generate(
                request_id=episode_of(request_id) if request_id else uuid4().hex,
                prompt_ids=list(prompt_ids),
                sampling_params=self.sampling_params(params),
                **media,
            )
        finally:
            self.generate_seconds += time.perf_counter() - started

    def generation(self, output: Any, params: SamplingParams) -> Generation:
        if getattr(output, "num_preempted", None) is not None:
            self.num_preempted = max(self.num_preempted, 0) + int(output.num_preempted)
        self._track_global_steps(getattr(output, "extra_fields", None) or {})
        generation = super().generation(output, params)
        ids = generation.token_ids
        if generation.finish_reason == "stop" and (not ids or int(ids[-1]) not in params.stop_token_ids):
            return dataclasses.replace(generation, finish_reason="length")  # verl's "completed" covers vLLM's "length"
        return generation

    def _track_global_steps(self, extra: Mapping[str, Any]) -> None:
        first, last = extra.get("min_global_steps"), extra.get("max_global_steps")
        if first is not None and "min_global_steps" not in self.extra_fields:
            self.extra_fields["min_global_steps"] = first
        if last is not None:
            self.extra_fields["max_global_steps"] = last


class _TimedEnv:
    """The runner's async env, with the time spent in ``step`` summed (verl's ``tool_calls`` metric).
    ``no_images``: the error to raise when an observation carries images (the model is text-only)."""

    def __init__(self, env: Any, no_images: str | None = None):
        self.inner = as_async_env(env)
        self.step_seconds = 0.0
        self.no_images = no_images

    def _check(self, observation: Any) -> None:
        if self.no_images and observation_images(observation):
            raise ValueError(self.no_images)

    @property
    def env_id(self) -> str | None:
        return getattr(self.inner, "env_id", None)

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        observation, info = await self.inner.reset(seed=seed, options=options)
        self._check(observation)
        return observation, info

    async def step(self, action: str) -> Any:
        started = time.perf_counter()
        try:
            step = await self.inner.step(action)
        finally:
            self.step_seconds += time.perf_counter() - started
        self._check(step[0])
        return step


class _LeftTruncatedPrompt:
    """A :class:`ChatFormatter` whose first prompt keeps only its last ``limit`` tokens (verl's rule for
    over-long prompts); everything else is the formatter's."""

    def __init__(self, formatter: ChatFormatter, limit: int, label: str):
        self._formatter = formatter
        self._limit = int(limit)
        self._label = label
        self._last: tuple[str, list[int]] | None = None

    def prompt_ids(self, observation: Any) -> list[int]:
        if self._last is not None and self._last[0] == observation:
            return list(self._last[1])
        ids = self._formatter.prompt_ids(observation)
        if len(ids) > self._limit and isinstance(observation, MultimodalObservation):
            # verl's rule (AgentLoopBase.ct_build_initial_tokens): cutting image tokens would misalign the images
            raise ValueError(
                f"{self._label}: a prompt with images of {len(ids)} tokens exceeds rollout.prompt_length={self._limit}; "
                "image tokens cannot be cut: raise rollout.prompt_length or make the images smaller"
            )
        if len(ids) > self._limit:
            logger.warning("%s: prompt of %d tokens exceeds rollout.prompt_length=%d; left-truncating.", self._label, len(ids), self._limit)
            ids = ids[-self._limit :]
        self._last = (observation, ids)
        return list(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._formatter, name)


def env_from_row(row: Mapping[str, Any]) -> Any:
    """Make the env a dataset row names (:meth:`gem_core.tasks.TaskSpec.from_columns`, then ``make_env``)."""
    return TaskSpec.from_columns(row).make_env()


@register(AGENT_NAME)
class GemEnvAgentLoop(AgentLoopBase):
    """Plays one GEM env episode per sample (see the module docstring for the dataset columns)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        check_trainer_config(self.config)
        # verl's data.mm_processor_kwargs, as AgentLoopBase read it for its own loops
        self.gem_mm_processor_kwargs = _plain_kwargs(self.mm_processor_kwargs)

    def make_env(self, spec: TaskSpec) -> Any:
        """The env for a row's spec; override to build envs another way."""
        return spec.make_env()

    def max_turns(self, spec: TaskSpec) -> int | None:
        """The row's turn limit, else ``rollout.multi_turn.max_assistant_turns``."""
        value = spec.max_turns
        if not value:
            value = self.rollout_config.multi_turn.get("max_assistant_turns") if "multi_turn" in self.rollout_config else None
        return int(value) if value else None

    def formatter(self, spec: TaskSpec) -> ChatFormatter:
        """The row's chat formatter: over verl's multimodal processor when it gave one (a VL model), else
        over the tokenizer."""
        kwargs = self.apply_chat_template_kwargs or {}
        if _is_multimodal(self.processor):
            return _vl_formatter(self.processor, spec.system_prompt, kwargs, self.gem_mm_processor_kwargs)
        return cached_formatter(self.tokenizer, system_prompt=spec.system_prompt, chat_template_kwargs=kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = kwargs
        spec = TaskSpec.from_columns(row)
        inner = self.formatter(spec)
        formatter = _LeftTruncatedPrompt(inner, self.prompt_length, f"{spec.env_id} (seed {spec.seed})")
        policy = VerlServerPolicy(
            self.server_manager,
            sampling_params,
            image_token_id=getattr(inner, "image_token_id", None),
            image_token_counts=getattr(inner, "image_token_counts", None),
            mm_processor_kwargs=getattr(inner, "mm_processor_kwargs", None),
        )
        no_images = None
        if not isinstance(inner, VLChatFormatter):
            no_images = (
                f"gem_env: {spec.env_id} shows images, but verl gave the agent loop no multimodal processor "
                "(actor_rollout_ref.model.path is a text model, or one whose processor verl does not support): "
                "use a vision-language model verl supports (e.g. Qwen2.5-VL)"
            )
        params = SamplingParams(
            max_tokens=self.response_length,
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=max(int(sampling_params.get("top_k", -1) or -1), 0),
        )
        env = self.make_env(spec)
        timed = _TimedEnv(env, no_images)
        try:
            # The whole response (every turn and observation) must fit verl's response_length.
            trajectory = await play_row(
                spec,
                policy,
                formatter,
                RunConfig(params=params, max_turns=self.max_turns(spec)),
                response_budget=self.response_length,
                env=timed,
                episode_id=_plain(row.get("episode_id")) or uuid4().hex,
                group_id=str(_plain(row.get("uid")) or "") or None,
            )
        finally:
            env.close()
        metrics = AgentLoopMetrics(generate_sequences=policy.generate_seconds, tool_calls=timed.step_seconds, num_preempted=policy.num_preempted)
        return self.to_output(trajectory, policy, metrics)

    def to_output(self, trajectory: Trajectory, policy: VerlServerPolicy | None = None, metrics: AgentLoopMetrics | None = None) -> GemAgentLoopOutput:
        """The trajectory's sequence view as verl's AgentLoopOutput (with per-turn rewards and turn ids)."""
        extra = {
            "turn_scores": trajectory.rewards,
            "gem_env_id": trajectory.env_id,
            "gem_terminated": trajectory.terminated,
            "gem_truncation_reason": trajectory.truncation_reason,
            **(policy.extra_fields if policy is not None else {}),
        }
        if metrics is None:
            metrics = AgentLoopMetrics(num_preempted=policy.num_preempted if policy is not None else -1)
        failure = trajectory.infra_error or ""
        if failure:
            extra["gem_infra_error"] = failure
        # verl's key ("images"): it builds the actor's multi_modal_inputs from them (with mm_processor_kwargs, as
        # its own loops set it); text rows leave both fields unset
        media: dict[str, Any] = {}
        if trajectory.images:
            kwargs = policy.mm_processor_kwargs if policy is not None else self.gem_mm_processor_kwargs
            media = {"multi_modal_data": {"images": list(trajectory.images)}, "mm_processor_kwargs": dict(kwargs)}
        if not trajectory.turns:  # ended before the first response: one masked token, no reward
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            # the same fields as every other row of the batch: verl concatenates them
            wants_logprobs = policy is not None and bool(policy.base_sampling_params.get("logprobs"))
            return GemAgentLoopOutput(
                prompt_ids=trajectory.prompt_ids,
                response_ids=[pad],
                response_mask=[0],
                reward_score=0.0,
                response_logprobs=[0.0] if wants_logprobs else None,
                num_turns=1,
                metrics=metrics,
                extra_fields=extra,
                token_rewards=[0.0],
                turn_ids=[-1],
                infra_error=failure,
                success=trajectory.success,
                **media,
            )
        # gem_core's sequence view; an infra-failed episode's row keeps its tokens but carries no loss
        # (mask 0), no turn (-1) and no reward, so it is out of the loss and out of ReBN's statistics
        row = sequence_batch([trajectory], pad_id=0)
        n = row.lengths[0]
        logprobs = None if row.logprobs is None else row.logprobs[0, :n].tolist()
        return GemAgentLoopOutput(
            prompt_ids=row.prompt_ids[0],
            response_ids=row.response_ids[0, :n].tolist(),
            response_mask=row.loss_mask[0, :n].astype(int).tolist(),
            response_logprobs=logprobs,
            reward_score=0.0 if failure else trajectory.episode_return,
            num_turns=2 * len(trajectory.turns),
            metrics=metrics,
            extra_fields=extra,
            token_rewards=row.token_rewards[0, :n].tolist(),
            turn_ids=row.turn_ids[0, :n].tolist(),
            infra_error=failure,
            success=trajectory.success,
            **media,
        )


def _is_multimodal(processor: Any) -> bool:
    """verl's test for a multimodal processor (``continuous_token_wiring._is_multimodal_processor``)."""
    return processor is not None and getattr(processor, "image_processor", None) is not None


_VL_FORMATTERS: dict[tuple, VLChatFormatter] = {}


def _vl_formatter(
    processor: Any, system_prompt: str | None, chat_template_kwargs: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any] | None = None
) -> VLChatFormatter:
    """A :class:`VLChatFormatter` built once per (processor, system prompt, template kwargs, processor
    kwargs): verl builds an agent loop per sample, and building a formatter probes the chat template. A
    worker keeps one processor, so the processor's identity is the key (checked: a new object at a reused
    id is rebuilt)."""
    kwargs = dict(chat_template_kwargs)
    mm_kwargs = dict(mm_processor_kwargs or {})
    key = (id(processor), system_prompt, json.dumps(kwargs, sort_keys=True, default=str), json.dumps(mm_kwargs, sort_keys=True, default=str))
    formatter = _VL_FORMATTERS.get(key)
    if formatter is None or formatter.processor is not processor:
        if len(_VL_FORMATTERS) >= 64:
            _VL_FORMATTERS.clear()
        formatter = _VL_FORMATTERS[key] = VLChatFormatter(processor, system_prompt=system_prompt, chat_template_kwargs=kwargs, mm_processor_kwargs=mm_kwargs)
    return formatter


def _plain_kwargs(value: Any) -> dict[str, Any]:
    """verl's ``data.mm_processor_kwargs`` (an OmegaConf node, a dict or None) as a plain dict."""
    if value is None:
        return {}
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return dict(value)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays from verl's non-tensor batch as plain Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
