"""Plays the planned episodes: many in flight at once, each handed on (written, counted) as it ends.

Each episode is played the way a trainer plugin plays a dataset row: the env from its
:class:`~gem_core.tasks.TaskSpec` (``make_env``, tools included), then
:func:`~gem_core.rollout.run_episode` with the policy. The scheduling is not
:func:`~gem_core.rollout.run_episodes`' because an evaluation needs four things a training batch does
not: each episode's result as soon as it ends (so a killed run keeps it), every other episode going on
when one fails, episode ids that stay the same when a run is resumed (a local model's sampling is
seeded by them), and the episode's env for the baseline policies that act through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gem_core.eval.plan import EvalJob
from gem_core.eval.policies import EpisodeMeter, EvalPolicy
from gem_core.eval.results import EpisodeResult
from gem_core.rollout import RunConfig, Trajectory, run_episode


async def evaluate(
    jobs: Sequence[EvalJob],
    policy: EvalPolicy,
    config: RunConfig,
    *,
    concurrency: int,
    on_result: Callable[[EpisodeResult], None],
    save_transcripts: bool = False,
) -> None:
    """Play ``jobs`` with at most ``concurrency`` episodes in flight; ``on_result`` gets each result
    (on the event loop, in the order episodes end). Errors inside an episode end only that episode;
    an exception from ``on_result`` (or a cancellation) stops the run."""
    gate = asyncio.Semaphore(concurrency)

    async def play(job: EvalJob) -> None:
        async with gate:
            result = await play_episode(job, policy, config, save_transcript=save_transcripts)
        on_result(result)

    tasks = [asyncio.ensure_future(play(job)) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def evaluate_sync(jobs: Sequence[EvalJob], policy: EvalPolicy, config: RunConfig, *, concurrency: int, **kwargs: Any) -> None:
    """:func:`evaluate` on a new event loop whose thread pool (env steps, HTTP requests) has room for
    every episode in flight: the default pool (a few threads per core) would bound requests below
    ``concurrency``, and a request that hangs would hold a thread of it."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=2 * concurrency + 4, thread_name_prefix="gem-eval")
        loop.set_default_executor(executor)
        await evaluate(jobs, policy, config, concurrency=concurrency, **kwargs)

    asyncio.run(main())


async def play_episode(job: EvalJob, policy: EvalPolicy, config: RunConfig, *, save_transcript: bool = False) -> EpisodeResult:
    """One episode to its end; whatever goes wrong is recorded in the result's ``error``."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    meter = EpisodeMeter(None, system_prompt=policy.system_prompt)
    trajectory: Trajectory | None = None
    env = None
    try:
        env = await loop.run_in_executor(None, job.spec.make_env)
        meter.policy = policy.for_env(env)
        trajectory = await run_episode(
            env,
            meter.wrap(),
            policy.formatter,
            config,
            seed=job.spec.seed,
            options=job.options,
            episode_id=job.episode_id,
            env_id=job.spec.env_id,
        )
    except Exception as exc:  # an env that raised, a policy that returned nonsense: this episode only
        meter.error = meter.error or f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            try:
                env.close()
            except Exception as exc:
                meter.error = meter.error or f"closing the env: {type(exc).__name__}: {exc}"
    return episode_result(job, policy, trajectory, meter, time.perf_counter() - started, save_transcript)


def episode_result(
    job: EvalJob, policy: EvalPolicy, trajectory: Trajectory | None, meter: EpisodeMeter, seconds: float, save_transcript: bool
) -> EpisodeResult:
    """The results-file line of one episode (a trajectory of ``None``: it never started)."""
    turns = trajectory.turns if trajectory is not None else []
    known = policy.counts_tokens and meter.usage_known and meter.requests > 0
    return EpisodeResult(
        env_id=job.spec.env_id,
        seed=job.spec.seed,
        item=job.item,
        episode=job.episode,
        model=policy.label,
        success=bool(turns) and bool(turns[-1].info.get("success", False)),
        return_=float(sum(turn.reward for turn in turns)),
        turns=len(turns),
        tool_calls=sum(turn.is_tool_call for turn in turns),
        tokens_in=meter.tokens_in if known else None,
        tokens_out=meter.tokens_out if known else None,
        terminated=bool(trajectory is not None and trajectory.terminated),
        truncation_reason=trajectory.truncation_reason if trajectory is not None else None,
        finish_reason=meter.last_finish,
        error=meter.error,
        seconds=round(seconds, 4),
        transcript=transcript(trajectory, policy) if save_transcript and trajectory is not None else None,
    )


def transcript(trajectory: Trajectory, policy: EvalPolicy) -> dict[str, Any]:
    """The episode as read: the system prompt, the first message, then per turn the model's response,
    the action the env received, its observation (as shown to the model when the episode went on)
    and reward."""
    system = policy.system_prompt if policy.formatter is None else policy.formatter.system_prompt
    return {
        "system": system,
        "first_message": trajectory.initial_message,
        "turns": [
            {
                "response": turn.response_text,
                "action": turn.action,
                "observation": turn.message or turn.observation,
                "reward": turn.reward,
            }
            for turn in trajectory.turns
        ],
    }
