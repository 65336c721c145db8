"""Episode bookkeeping: a turn recorded in the :class:`~gem_core.rollout.trajectory.Trajectory` after each env step,
the end of an episode (terminated, truncated and why, an infrastructure failure), and the checks on what a policy
and an env hand back (a :class:`~gem_core.rollout.policy.Generation` within its budget, a text observation).

Separate from :mod:`gem_core.rollout.runner` because two runners keep the same books: the single-agent runner and
the multi-agent one (:mod:`gem_core.rollout.multiagent`), so that a trajectory and its truncation reasons mean the
same whichever played it. No event loop, no policy calls: plain functions on a trajectory.
"""

from __future__ import annotations

from typing import Any

from gem_core.errors import infra_error
from gem_core.multimodal import MultimodalObservation, observation_text
from gem_core.rollout.policy import Generation
from gem_core.rollout.trajectory import Trajectory, Turn


def record_turn(
    trajectory: Trajectory,
    index: int,
    step: tuple[Any, Any, Any, Any, Any],
    finish_reason: str,
    response_text: str,
    action: str,
    *,
    context_len: int = 0,
    response_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> Turn:
    """Append the :class:`Turn` that one env step made (token ids only in token mode) and return it."""
    observation, reward, terminated, truncated, info = step
    record = Turn(
        index=index,
        context_len=context_len,
        response_ids=[] if response_ids is None else response_ids,
        logprobs=logprobs,
        obs_delta_ids=[],
        reward=float(reward),
        terminated=bool(terminated),
        truncated=bool(truncated),
        info=dict(info),
        finish_reason=finish_reason,
        response_text=response_text,
        action=action,
        observation=observation_text(observation) if isinstance(observation, (str, MultimodalObservation)) else repr(observation),
    )
    trajectory.turns.append(record)
    return record


def episode_over(trajectory: Trajectory, record: Turn, max_turns: int | None) -> bool:
    """Mark the end of the episode after a step, if it ended; True when it did. A step whose info reports
    an infrastructure failure ends it (its reward says nothing about the policy)."""
    failure = infra_error(record.info)
    if failure is not None:
        trajectory.infra_error = failure
        truncate_episode(trajectory, "env_error" if record.info.get("error") else "infra_error")  # a dead env worker: env_error
        return True
    if record.terminated:
        trajectory.terminated = True
        return True
    if record.truncated:
        info = record.info
        reason = info.get("truncation_reason") or ("env_error" if info.get("error") else "max_turns")
        truncate_episode(trajectory, reason)
        return True
    if max_turns is not None and len(trajectory.turns) >= max_turns:
        truncate_episode(trajectory, "max_turns")
        return True
    return False


def truncate_episode(trajectory: Trajectory, reason: str) -> None:
    """End the episode as truncated; the last turn (if any) says why."""
    trajectory.truncated = True
    trajectory.truncation_reason = reason
    if trajectory.turns:
        last = trajectory.turns[-1]
        last.truncated = True
        last.info["truncation_reason"] = reason


def check_generation(generation: Generation, budget: int, policy: Any) -> None:
    if not isinstance(generation, Generation):
        raise TypeError(f"{type(policy).__name__}.generate returned {type(generation).__name__}, not a Generation")
    if len(generation.token_ids) > budget:
        raise ValueError(f"{type(policy).__name__} returned {len(generation.token_ids)} tokens for max_tokens={budget}")


def require_observation(observation: Any, where: str) -> None:
    if not isinstance(observation, (str, MultimodalObservation)):
        raise TypeError(f"the runner needs text observations (or gem_core.MultimodalObservation); {where}() returned {type(observation).__name__}")
