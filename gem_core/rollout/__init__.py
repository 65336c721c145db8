"""The framework-neutral multi-turn episode runner: token in, token out (DESIGN.md contracts 3 and 4).

    formatter = ChatFormatter(tokenizer)                     # chat template as token deltas
    config = RunConfig(params=SamplingParams(max_tokens=256), max_context_tokens=4096)
    trajectory = await run_episode(env, policy, formatter, config, seed=0)
    samples = trajectory.per_turn_samples(gamma=0.9)         # one sample per turn (GEM's default)
    sequence = trajectory.as_sequence()                      # one sequence with a loss mask (agent-loop view)

``run_episodes`` plays a batch over a pool of envs, a vector env or env ids, with GRPO-style groups.
Trainer plugins implement :class:`Policy` around their engine. Nothing here imports torch or
transformers until a policy that needs them is built.
"""

from gem_core.rollout.async_env import AsyncEnv, ThreadedEnv, VectorEnvSlots, as_async_env
from gem_core.rollout.chat import ChatFormatter, ChatTemplateError, cached_formatter, strip_thinking
from gem_core.rollout.engine import EnginePolicy, VLLMPolicy, collapse_image_tokens, engine_image_prompt, engine_max_model_len
from gem_core.rollout.http import ModelRequestError, Retry
from gem_core.rollout.hf_policy import HFPolicy
from gem_core.rollout.policies import OpenAIPolicy, RandomPolicy, ScriptedPolicy, scripted_logprob
from gem_core.rollout.policy import (
    ChatPolicy,
    ContextLimitExceeded,
    FinishReason,
    Generation,
    Policy,
    SamplingParams,
    answer_each,
    derive_seed,
    episode_of,
    is_context_refusal,
    request_id_for,
    resolve_in_thread,
)
from gem_core.rollout.runner import EpisodeSpec, Row, RunConfig, play_row, row_config, run_episode, run_episodes, run_episodes_sync
from gem_core.rollout.multiagent import PolicySimulator, endpoint_simulator, run_multiagent_episode, run_multiagent_episodes
from gem_core.rollout.trajectory import TRUNCATION_REASONS, SequenceView, Trajectory, Turn, TurnSample
from gem_core.rollout.vision import VLChatFormatter

__all__ = [
    "collapse_image_tokens",
    "engine_image_prompt",
    "PolicySimulator",
    "endpoint_simulator",
    "run_multiagent_episode",
    "run_multiagent_episodes",
    "TRUNCATION_REASONS",
    "AsyncEnv",
    "ChatFormatter",
    "ChatPolicy",
    "ChatTemplateError",
    "ContextLimitExceeded",
    "EnginePolicy",
    "EpisodeSpec",
    "FinishReason",
    "Generation",
    "HFPolicy",
    "ModelRequestError",
    "OpenAIPolicy",
    "Policy",
    "RandomPolicy",
    "Retry",
    "Row",
    "RunConfig",
    "SamplingParams",
    "ScriptedPolicy",
    "SequenceView",
    "ThreadedEnv",
    "VLLMPolicy",
    "VLChatFormatter",
    "Trajectory",
    "Turn",
    "TurnSample",
    "VectorEnvSlots",
    "answer_each",
    "as_async_env",
    "cached_formatter",
    "derive_seed",
    "engine_max_model_len",
    "episode_of",
    "is_context_refusal",
    "play_row",
    "request_id_for",
    "resolve_in_thread",
    "row_config",
    "run_episode",
    "run_episodes",
    "run_episodes_sync",
    "scripted_logprob",
    "strip_thinking",
]
