"""The GEM agent file for OpenRLHF 0.11.x: pass its path as ``--train.agent_func_path``.

    --train.agent_func_path $(gem-core openrlhf agent-path)

OpenRLHF loads this file by path (``_load_agent_executor``) and calls ``AgentExecutor().execute(...)``
once per sample. :class:`AgentExecutor` is a subclass of OpenRLHF's ``MultiTurnAgentExecutor`` whose
``execute`` plays the episode with gem_core's runner (:func:`gem_core.rollout.play_row`) over
OpenRLHF's engine (:class:`~gem_integrations.openrlhf.engine.OpenRLHFEnginePolicy`), and returns the
dict OpenRLHF's own ``MultiTurnAgentExecutor.execute`` returns, so ``_process_response_into_experience``
reads it unchanged. Working from the engine's token ids (never its text), each turn's end-of-turn
token is in the sequence exactly once, with or without ``skip_special_tokens``.

Each sample's episode is its prompt row's label, a :class:`gem_core.tasks.TaskSpec` as JSON
(``gem-core make-dataset openrlhf`` writes it); every sample of a prompt shares it, so a group starts
from one state. The row's prompt text is not used: the first context is the env's own first message
(:func:`gem_core.model_message`) in the chat template.

Limits:

* the whole sequence (prompt, responses, observations) stays within OpenRLHF's ``max_len``
  (``--data.max_len``; the label's ``max_context_tokens`` can lower it): when the next observation
  would not fit, the episode ends as truncated with reason ``context_limit`` (the runner's rule);
* each response is capped at the label's ``max_turn_tokens``, else ``GEM_OPENRLHF_MAX_TURN_TOKENS``,
  else OpenRLHF's ``--rollout.max_new_tokens`` (applied per turn), else only by what is left of
  ``max_len`` (what OpenRLHF's own multi-turn executor asks for on every turn);
* the label's ``max_turns`` on top of the env's own.

An episode the infrastructure failed (``Trajectory.infra_error``: the engine aborted a request, or a
step's ``info["infra_error"]`` reported a dead sandbox or env worker) is kept out of training: no action
range (OpenRLHF's ``action_mask`` is all 0, so no loss), reward 0, and no turn rewards or spans (so the
``rebn`` patch counts none of its turns in the statistics); ``extra_logs["gem_infra_failed"]`` is 1.0 for
it, 0.0 otherwise (OpenRLHF logs the batch's mean: the fraction of such episodes). Keeping it out of
OpenRLHF's own group baselines (``rloo``, ``group_norm``, ...) is the advantage patch's work
(:mod:`gem_integrations.openrlhf.advantage`), armed by the ``gem-core openrlhf train`` launcher; in a run
that the launcher did not start (no ``GEM_OPENRLHF_TURNS=1``), the first such episode logs one warning
saying so.

The env is closed however the episode ends (done, truncated, an exception in the env or the engine,
cancellation). ``truncated`` in the result is true when the episode was cut for length: its last
response hit ``max_tokens`` (OpenRLHF's own meaning) or it hit the context limit. ``extra_logs`` has,
with the same keys on every sample, ``gem_episode_length``, ``gem_success``, ``gem_truncated``,
``gem_context_limit`` and ``gem_infra_failed``; when ``GEM_OPENRLHF_TURNS=1`` (the ``gem-core openrlhf train`` launcher sets it
in every Ray worker) also ``gem_turn_rewards`` (one reward per turn) and ``gem_turn_spans`` (each turn's
``[start, end)`` in the sequence, flattened), which the ``rebn`` patch reads as the explicit turns.

Vision envs (observations with images, e.g. ``vision:Geometry-v0``) need a vision-language model:
OpenRLHF then hands the agent the model's ``AutoProcessor`` as ``hf_tokenizer`` (its ``get_tokenizer``
does so for a model whose config has a ``vision_config``), and the episode is rendered by a
:class:`gem_core.rollout.VLChatFormatter` over it (the images expanded by the processor itself, as
OpenRLHF's ``process_prompt_with_images`` does). Every engine call carries the context's images as
``multi_modal_data={"image": [...]}`` (:class:`~gem_integrations.openrlhf.engine.OpenRLHFEnginePolicy`),
and the result's ``mm_train_inputs`` holds the processor's tensors for all of the sequence's images
(``pixel_values``, ``image_grid_thw``, ...: the keys OpenRLHF's own executor keeps), which OpenRLHF's
VLM actor forward takes with the sequence; ``images`` echoes the row's, as OpenRLHF's executor does.
The images are the env's own (the row's ``images`` column, written by ``gem-core make-dataset
openrlhf``, are for OpenRLHF's dataset and logs). A sample with no generated turn carries no images (its
image tokens dropped, as OpenRLHF drops images that do not fit): it has no action, so no loss. A row
with images and a text model is one clear error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from gem_core.rollout import ChatFormatter, RunConfig, Trajectory, VLChatFormatter, cached_formatter, play_row
from gem_core.tasks import TaskSpec
from gem_integrations.openrlhf.engine import OpenRLHFEnginePolicy, gem_params

logger = logging.getLogger(__name__)

TURNS_ENV = "GEM_OPENRLHF_TURNS"
MAX_TURN_TOKENS_ENV = "GEM_OPENRLHF_MAX_TURN_TOKENS"
TURN_REWARDS_KEY = "gem_turn_rewards"
TURN_SPANS_KEY = "gem_turn_spans"
INFRA_FAILED_KEY = "gem_infra_failed"
_WARNED: set[str] = set()
LOG_KEYS = ("gem_episode_length", "gem_success", "gem_truncated", "gem_context_limit", INFRA_FAILED_KEY)


def is_processor(hf_tokenizer: Any) -> bool:
    """Whether OpenRLHF handed over a vision-language model's processor (OpenRLHF's own test)."""
    return hasattr(hf_tokenizer, "image_processor")


_VL_FORMATTERS: OrderedDict[tuple, VLChatFormatter] = OrderedDict()
_VL_LOCK = threading.Lock()
_VL_CACHE_SIZE = 8


def formatter_for(tokenizer: Any, system_prompt: str | None = None) -> ChatFormatter:
    """The :class:`ChatFormatter` for (tokenizer, system prompt), or for a processor the
    :class:`VLChatFormatter`, built once per process (OpenRLHF sends a fresh copy with every Ray call, so a
    named one is keyed by its name, chat template and size, as :func:`gem_core.rollout.cached_formatter` does)."""
    if not is_processor(tokenizer):
        return cached_formatter(tokenizer, system_prompt=system_prompt)
    inner = tokenizer.tokenizer
    name = getattr(inner, "name_or_path", None)
    key = (name, getattr(tokenizer, "chat_template", None), len(inner), system_prompt) if name else (id(tokenizer), system_prompt)
    with _VL_LOCK:
        formatter = _VL_FORMATTERS.get(key)
        if formatter is None or (not name and formatter.processor is not tokenizer):
            formatter = VLChatFormatter(tokenizer, system_prompt=system_prompt)
        _VL_FORMATTERS[key] = formatter
        _VL_FORMATTERS.move_to_end(key)
        while len(_VL_FORMATTERS) > _VL_CACHE_SIZE:
            _VL_FORMATTERS.popitem(last=False)
        return formatter


def mm_train_inputs(formatter: VLChatFormatter, images: Sequence[Any], tokens: Sequence[int]) -> dict[str, Any] | None:
    """The formatter's processor's tensors for ``images`` (OpenRLHF's ``process_prompt_with_images`` over one image
    token per image: the multimodal keys it keeps, in image order), checked against the image tokens of
    the sequence ``tokens`` (a mismatch would fail in the actor forward, far from its cause)."""
    if not images:
        return None
    from openrlhf.utils.vlm_utils import process_prompt_with_images  # needs Pillow: imported for images only, as OpenRLHF does

    ids, inputs, _ = process_prompt_with_images(formatter.processor, formatter.image_token * len(images), list(images))
    expected, found = ids.count(formatter.image_token_id), list(tokens).count(formatter.image_token_id)
    if expected != found:
        raise ValueError(f"the sequence has {found} image tokens but the processor gives {expected} for its {len(images)} images")
    return inputs


def run_config(spec: TaskSpec, sampling_params: Any, max_length: int) -> RunConfig:
    """The runner's limits for one sample (see the module docstring for the order of the caps)."""
    max_context = min(int(max_length), spec.max_context_tokens or int(max_length))
    cap = spec.max_turn_tokens or _env_int(MAX_TURN_TOKENS_ENV) or getattr(sampling_params, "max_tokens", None)
    per_turn = max_context if cap is None else min(int(cap), max_context)
    return RunConfig(params=gem_params(sampling_params, per_turn), max_turns=spec.max_turns, max_context_tokens=max_context)


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    value = int(text)
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {text!r}")
    return value


def openrlhf_result(
    trajectory: Trajectory, prompt: Any, label: Any, images: Any, with_logprobs: bool, max_length: int, formatter: Any = None
) -> dict[str, Any]:
    """The dict OpenRLHF's ``MultiTurnAgentExecutor.execute`` returns, from the runner's trajectory (an
    infra-failed episode: no action range, no reward, no turns; see the module docstring). ``formatter``
    (a :class:`VLChatFormatter`): for a trajectory with images, its ``mm_train_inputs``."""
    sequence = trajectory.as_sequence()
    tokens = list(sequence.prompt_ids) + list(sequence.response_ids)
    mm_inputs = None
    if trajectory.images and not trajectory.turns:  # no action, no loss: the sample goes without its images
        tokens = [t for t in tokens if t != formatter.image_token_id]
    elif trajectory.images:
        mm_inputs = mm_train_inputs(formatter, trajectory.images, tokens)
    infra_failed = trajectory.infra_error is not None
    if infra_failed and os.environ.get(TURNS_ENV) != "1" and "infra" not in _WARNED:
        _WARNED.add("infra")
        logger.warning(
            "gem: the infrastructure failed a GEM episode (%s), but this run was not started by `gem-core openrlhf train`: "
            "its sample carries no loss, but OpenRLHF's group baselines (rloo, group_norm, reinforce_baseline, dr_grpo, "
            "flash_reinforce) count its reward 0. Launch with `gem-core openrlhf train` to leave it out.",
            trajectory.infra_error,
        )
    spans = [] if infra_failed else [(turn.context_len, turn.context_len + len(turn.response_ids)) for turn in trajectory.turns]
    logprobs = None
    if with_logprobs:
        if trajectory.turns and sequence.logprobs is None:
            raise ValueError("the engine returned no logprobs although the sampling params ask for them")
        logprobs = [0.0] * (len(tokens) - len(sequence.response_ids)) + list(sequence.logprobs or [])
    if not trajectory.turns:  # the first message alone does not fit: nothing was generated
        tokens = tokens[:max_length]
        logprobs = None if logprobs is None else logprobs[:max_length]
    rewards = [] if infra_failed else [float(r) for r in trajectory.rewards]
    last = trajectory.turns[-1] if trajectory.turns else None
    context_limit = trajectory.truncation_reason == "context_limit"
    logs: dict[str, Any] = {
        "gem_episode_length": len(trajectory.turns),
        "gem_success": float(bool(last is not None and last.info.get("success", False))),
        "gem_truncated": float(bool(trajectory.truncated)),
        "gem_context_limit": float(context_limit),
        INFRA_FAILED_KEY: float(infra_failed),
    }
    if os.environ.get(TURNS_ENV) == "1":
        logs[TURN_REWARDS_KEY] = rewards
        logs[TURN_SPANS_KEY] = [p for span in spans for p in span]
    total = float(sum(rewards))
    return {
        "prompt": prompt,
        "label": label,
        "images": images,
        "mm_train_inputs": mm_inputs,
        "reward": total,
        "scores": total,
        "observation_tokens": tokens,
        "action_ranges": spans,
        "rollout_log_probs": logprobs,
        "truncated": bool((last is not None and last.finish_reason == "length") or context_limit),
        "extra_logs": logs,
    }


class GemAgentInstance(AgentInstanceBase):
    """Placeholder for OpenRLHF's ``MultiTurnAgentExecutor(agent_instance_cls)`` check; the episode is
    played by gem_core's runner in :meth:`AgentExecutor.execute`, not step by step through this class."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    async def step(self, states: dict, **kwargs: Any) -> dict:
        raise RuntimeError("GEM episodes are played by AgentExecutor.execute (gem_core's runner), not per step")


class AgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's ``MultiTurnAgentExecutor`` playing a GEM episode with gem_core's runner."""

    def __init__(self) -> None:
        super().__init__(GemAgentInstance)

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        vision = is_processor(hf_tokenizer)
        if images and not vision:
            raise ValueError(
                "this row has images but OpenRLHF loaded a text tokenizer: train a vision-language model (one whose config has a "
                "vision_config, so OpenRLHF loads its AutoProcessor) with --data.max_images_per_prompt N"
            )
        spec = TaskSpec.from_json(label)
        formatter = formatter_for(hf_tokenizer, spec.system_prompt)
        config = run_config(spec, sampling_params, max_length)
        # OpenRLHF's max_len caps the row's own limits: the row played is the one with the caps folded in
        row = dataclasses.replace(spec, max_turn_tokens=config.params.max_tokens, max_context_tokens=config.max_context_tokens)
        policy = OpenRLHFEnginePolicy(llm_engine, sampling_params, getattr(formatter, "image_token_id", None), getattr(formatter, "image_token_counts", None))
        trajectory = await play_row(row, policy, formatter, config)
        with_logprobs = getattr(sampling_params, "logprobs", None) is not None
        return openrlhf_result(trajectory, prompt, label, images, with_logprobs, config.max_context_tokens, formatter)
