"""The episode runner: many multi-turn episodes in flight at once, token in and token out.

:func:`run_episode` plays one episode: the coroutine a trainer's per-sample agent loop calls (verl's
``AgentLoop.run``, OpenRLHF's ``AgentExecutor``). :func:`run_episodes` plays a batch over a pool of
envs, a vector env or env ids, with GRPO-style groups. Env steps run off the event loop (a thread, or
the vector env's worker processes), so one episode's step never holds up another's generation.

Envs as awaitables (:class:`AsyncEnv`, :class:`ThreadedEnv`, :class:`VectorEnvSlots`) are in
:mod:`gem_core.rollout.async_env`, the episode's books (a turn recorded, an episode ended) in
:mod:`gem_core.rollout.bookkeeping`; both are importable from here too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import secrets
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from gem_core.core import Env, model_message
from gem_core.multimodal import observation_images, observation_text, openai_content
from gem_core.rollout.async_env import AsyncEnv, ThreadedEnv, VectorEnvSlots, as_async_env
from gem_core.rollout.bookkeeping import check_generation, episode_over, record_turn, require_observation, truncate_episode
from gem_core.rollout.chat import ChatFormatter, strip_thinking
from gem_core.rollout.policy import ChatPolicy, Policy, SamplingParams, closing_brace_ids, is_context_refusal, merge_stop_ids, request_id_for
from gem_core.rollout.trajectory import ENGINE_ABORTED, Trajectory, is_tool_turn

__all__ = [
    "AsyncEnv",
    "EpisodeSpec",
    "Row",
    "RunConfig",
    "ThreadedEnv",
    "VectorEnvSlots",
    "as_async_env",
    "check_generation",
    "play_row",
    "record_turn",
    "require_observation",
    "row_config",
    "run_episode",
    "run_episodes",
    "run_episodes_sync",
    "truncate_episode",
]


@dataclass(frozen=True)
class RunConfig:
    """How episodes are played: the settings a trainer plugin fixes once per rollout.

    ``params``: sampling for every turn (``params.max_tokens`` caps each response). ``max_turns``: a
    turn limit on top of the env's own. ``max_context_tokens``: the whole context (prompt, responses,
    observations) stays within it; a turn's ``max_tokens`` is lowered to what is left, and when the
    next observation plus ``min_turn_tokens`` would not fit, the episode ends as truncated with reason
    ``"context_limit"`` (every reward earned so far kept). ``step_in_thread``: ``True``, ``False`` or
    ``"auto"`` (see :class:`ThreadedEnv`); ``executor``: where env steps run (default: the loop's).
    """

    params: SamplingParams = field(default_factory=SamplingParams)
    max_turns: int | None = None
    max_context_tokens: int | None = None
    min_turn_tokens: int = 1
    step_in_thread: bool | str = "auto"
    executor: Executor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"RunConfig.params must be a SamplingParams, got {type(self.params).__name__}")
        for name, low in (("max_turns", 1), ("max_context_tokens", 2)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"RunConfig.{name} must be an integer >= {low} or None, got {value!r}")
        if isinstance(self.min_turn_tokens, bool) or not isinstance(self.min_turn_tokens, int) or self.min_turn_tokens < 1:
            raise ValueError(f"RunConfig.min_turn_tokens must be an integer >= 1, got {self.min_turn_tokens!r}")
        if self.step_in_thread not in (True, False, "auto"):
            raise ValueError(f"RunConfig.step_in_thread must be True, False or 'auto', got {self.step_in_thread!r}")

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------------------------------
# One episode.
# ------------------------------------------------------------------------------------------------


async def run_episode(
    env: Any,
    policy: Policy | ChatPolicy,
    formatter: ChatFormatter | None = None,
    config: RunConfig | None = None,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    observation: str | None = None,
    reset_info: dict[str, Any] | None = None,
    episode_id: str | None = None,
    group_id: str | None = None,
    env_id: str | None = None,
) -> Trajectory:
    """Play one episode and return its :class:`Trajectory`.

    ``env``: a gem_core env (its steps run as ``config.step_in_thread`` says, see :class:`ThreadedEnv`)
    or an :class:`AsyncEnv`. It is reset with ``seed``/``options``, unless ``observation`` is given:
    then the env is taken as already reset (e.g. a clone of a group's start state) and
    ``observation``/``reset_info`` are what its reset returned.

    What the model sees: every message is :func:`gem_core.model_message` of the observation and its
    info (the observation, then ``info["suffix"]``: the board, for the games that keep it there).

    ``policy``: a token-level :class:`Policy` with a :class:`ChatFormatter` (the training path), or a
    text-level :class:`ChatPolicy` (``formatter`` optional, used for its system prompt and thinking
    removal; the trajectory then has text and rewards but no token ids).

    ``config``: the limits and sampling (:class:`RunConfig`; default ``RunConfig()``). The last turn of
    a truncated episode has ``truncated=True`` and ``info["truncation_reason"]``; so has the trajectory.

    ``episode_id`` (default: a random uuid) makes the request ids ``"{episode_id}/turn-{t}"``; pass a
    stable one for reproducible sampling.
    """
    config = RunConfig() if config is None else config
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    aenv = as_async_env(env, config.executor, config.step_in_thread)
    episode_id = episode_id or uuid.uuid4().hex
    if env_id is None:
        env_id = getattr(aenv, "env_id", None)
    if observation is None:
        observation, reset_info = await aenv.reset(seed=seed, options=options)
    require_observation(observation, "reset")
    reset_info = dict(reset_info or {})
    first = model_message(observation, reset_info)
    trajectory = Trajectory(
        episode_id=episode_id,
        prompt_ids=[],
        env_id=env_id,
        seed=seed,
        group_id=group_id,
        initial_observation=observation_text(observation),
        initial_message=observation_text(first),
        reset_info=reset_info,
        images=list(observation_images(first)),
    )
    token_level = hasattr(policy, "generate")
    if token_level:
        if formatter is None:
            raise TypeError("a token-level Policy needs a ChatFormatter (formatter=...)")
        if trajectory.images:
            _require_image_support(policy, formatter, env_id)
        await _play_tokens(trajectory, aenv, policy, formatter, config.replace(params=formatter.sampling_params(config.params)), first)
    elif hasattr(policy, "chat"):
        await _play_text(trajectory, aenv, policy, formatter, config, first)
    else:
        raise TypeError(f"{type(policy).__name__} has neither generate() (Policy) nor chat() (ChatPolicy)")
    return trajectory


async def _play_tokens(trajectory: Trajectory, env: Any, policy: Policy, formatter: ChatFormatter, config: RunConfig, first: Any) -> None:
    params, max_context_tokens, min_turn_tokens = config.params, config.max_context_tokens, config.min_turn_tokens
    context = formatter.prompt_ids(first)
    trajectory.prompt_ids = list(context)
    if max_context_tokens is not None and len(context) + min_turn_tokens > max_context_tokens:
        truncate_episode(trajectory, "context_limit")
        return
    turn = 0
    while True:
        budget = params.max_tokens if max_context_tokens is None else min(params.max_tokens, max_context_tokens - len(context))
        turn_params = params if budget == params.max_tokens else params.replace(max_tokens=budget)
        try:
            generation = await _generate(policy, context, turn_params, request_id_for(trajectory.episode_id, turn), trajectory.images)
        except Exception as exc:
            if not is_context_refusal(exc):
                raise
            truncate_episode(trajectory, "context_limit")  # the engine refused the prompt as over its window
            return
        check_generation(generation, budget, policy)
        if generation.finish_reason == "abort":
            trajectory.infra_error = ENGINE_ABORTED  # a partial response is not an action: the env is not stepped
            truncate_episode(trajectory, "abort")
            return
        if not generation.token_ids:
            truncate_episode(trajectory, "abort")  # an empty response is not an action either
            return
        response_text = formatter.response_text(generation.token_ids)
        action = formatter.action_text(response_text)
        observation, reward, terminated, truncated, info = step = await env.step(action)
        record = record_turn(
            trajectory,
            turn,
            step,
            generation.finish_reason,
            response_text,
            action,
            context_len=len(context),
            response_ids=generation.token_ids,
            logprobs=generation.logprobs,
        )
        context.extend(generation.token_ids)
        if episode_over(trajectory, record, config.max_turns):
            return
        require_observation(observation, "step")
        role = formatter.tool_role if is_tool_turn(info) else "user"
        message = model_message(observation, info)
        new_images = observation_images(message)
        if new_images:
            _require_image_support(policy, formatter, trajectory.env_id)
        delta = formatter.observation_ids(message, generation.token_ids, role)
        if max_context_tokens is not None and len(context) + len(delta) + min_turn_tokens > max_context_tokens:
            truncate_episode(trajectory, "context_limit")
            return
        record.message = observation_text(message)
        record.obs_delta_ids = delta
        record.obs_images = len(new_images)
        trajectory.images.extend(new_images)
        context.extend(delta)
        turn += 1


async def _play_text(trajectory: Trajectory, env: Any, policy: ChatPolicy, formatter: ChatFormatter | None, config: RunConfig, first: Any) -> None:
    trajectory.token_mode = False
    system = None if formatter is None else formatter.system_prompt
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": openai_content(first)})  # images as OpenAI image_url parts
    trajectory.messages = messages
    turn = 0
    while True:
        try:
            generation = await policy.chat([dict(m) for m in messages], config.params, request_id=request_id_for(trajectory.episode_id, turn))
        except Exception as exc:
            if not is_context_refusal(exc):
                raise
            truncate_episode(trajectory, "context_limit")
            return
        text = generation.text or ""
        if generation.finish_reason == "abort":
            trajectory.infra_error = ENGINE_ABORTED
            truncate_episode(trajectory, "abort")
            return
        action = formatter.action_text(text) if formatter is not None else strip_thinking(text)
        observation, reward, terminated, truncated, info = step = await env.step(action)
        record = record_turn(trajectory, turn, step, generation.finish_reason, text, action)
        messages.append({"role": "assistant", "content": text})
        if episode_over(trajectory, record, config.max_turns):
            return
        require_observation(observation, "step")
        message = model_message(observation, info)
        record.message = observation_text(message)
        record.obs_images = len(observation_images(message))
        trajectory.images.extend(observation_images(message))
        messages.append({"role": "tool" if is_tool_turn(info) else "user", "content": openai_content(message)})
        turn += 1


def _generate(policy: Any, context: list[int], params: SamplingParams, request_id: str, images: list[Any]) -> Any:
    """The policy's call; the context's images, when it has any, as vLLM's ``multi_modal_data``."""
    if not images:
        return policy.generate(list(context), params, request_id=request_id)
    return policy.generate(list(context), params, request_id=request_id, multi_modal_data={"image": list(images)})


def _require_image_support(policy: Any, formatter: Any, env_id: str | None) -> None:
    """An env that shows images needs a formatter that renders them and a policy that takes them."""
    who = env_id or "the env"
    if not getattr(formatter, "supports_images", False):
        raise TypeError(f"{who} shows images: use gem_core.rollout.VLChatFormatter(processor), not {type(formatter).__name__}")
    if hasattr(policy, "generate") and "multi_modal_data" not in inspect.signature(policy.generate).parameters:
        raise TypeError(f"{who} shows images: {type(policy).__name__}.generate takes no multi_modal_data")


# ------------------------------------------------------------------------------------------------
# One dataset row.
# ------------------------------------------------------------------------------------------------


class Row(Protocol):
    """What :func:`play_row` needs of a dataset row: a :class:`gem_core.tasks.TaskSpec` (the row schema
    sits above the runner, so the runner sees it through this shape)."""

    env_id: str
    seed: int | None
    max_turns: int | None
    max_turn_tokens: int | None
    max_context_tokens: int | None

    def make_env(self) -> Env: ...


def row_config(row: Row, config: RunConfig, prompt_tokens: int | None = None, response_budget: int | None = None) -> RunConfig:
    """The limits of one row's episode: the row's own ``max_turn_tokens``, ``max_turns`` and
    ``max_context_tokens`` where it sets them, else ``config``'s (the trainer's defaults); then
    ``response_budget`` (the trainer's room for everything after the first prompt of ``prompt_tokens``)
    caps each response and the whole context at ``prompt_tokens + response_budget``."""
    params = config.params if row.max_turn_tokens is None else config.params.replace(max_tokens=row.max_turn_tokens)
    max_turns = row.max_turns if row.max_turns is not None else config.max_turns
    max_context = row.max_context_tokens if row.max_context_tokens is not None else config.max_context_tokens
    if response_budget is not None:
        if prompt_tokens is None:
            raise ValueError("a response budget needs the first prompt's length (prompt_tokens)")
        params = params.replace(max_tokens=min(params.max_tokens, int(response_budget)))
        budget = int(prompt_tokens) + int(response_budget)
        max_context = budget if max_context is None else min(max_context, budget)
    if max_context is not None:
        max_context = max(max_context, 2)  # RunConfig's floor; a first prompt that does not fit ends the episode
    return config.replace(params=params, max_turns=max_turns, max_context_tokens=max_context)


async def play_row(
    row: Row,
    policy: Policy | ChatPolicy,
    formatter: ChatFormatter,
    config: RunConfig | None = None,
    *,
    response_budget: int | None = None,
    env: Any = None,
    episode_id: str | None = None,
    group_id: str | None = None,
) -> Trajectory:
    """Play the episode one dataset row names, the way every trainer plugin does.

    ``row``: a :class:`gem_core.tasks.TaskSpec`. Its env is made (``env``: one made from it, or an
    :class:`AsyncEnv` over one, to use instead; the caller then closes it), reset with the row's seed, and
    played by ``policy`` through ``formatter`` (built with the row's system prompt) under
    :func:`row_config`: ``config`` holds the trainer's sampling and default limits, the row's own limits
    win where set, and ``response_budget`` (e.g. verl's ``response_length``, TRL's
    ``max_completion_length``) bounds everything the episode adds after its first prompt. A row with
    ``stop_after_box`` ends each response at the first token that holds a ``}`` (the one closing its
    ``\\boxed{...}`` move): the stop every trainer's engine then honours.
    """
    config = RunConfig() if config is None else config
    own = env is None
    made = row.make_env() if own else env
    try:
        aenv = as_async_env(made, config.executor, config.step_in_thread)
        observation, info = await aenv.reset(seed=row.seed)
        require_observation(observation, "reset")
        if observation_images(observation):
            _require_image_support(policy, formatter, row.env_id)
        prompt_tokens = None if response_budget is None else len(formatter.prompt_ids(model_message(observation, info)))
        played = row_config(row, config, prompt_tokens, response_budget)
        if getattr(row, "stop_after_box", False):  # TaskSpec.stop_after_box (a Row-like without the field: off)
            # the template's end of turn first (a scripted policy ends with the first stop id), then every token
            # that can close the \boxed{} move
            played = played.replace(params=merge_stop_ids(formatter.sampling_params(played.params), closing_brace_ids(formatter.tokenizer)))
        return await run_episode(
            aenv,
            policy,
            formatter,
            played,
            seed=row.seed,
            observation=observation,
            reset_info=info,
            episode_id=episode_id,
            group_id=group_id,
            env_id=row.env_id,
        )
    finally:
        if own:
            made.close()


# ------------------------------------------------------------------------------------------------
# A batch of episodes.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeSpec:
    """An episode (group) to play on a fresh env: the id, its ``make`` kwargs and the reset seed."""

    env_id: str
    seed: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Job:
    index: int
    group: int
    member: int
    seed: int | None
    spec: EpisodeSpec | None


async def run_episodes(
    envs: Any,
    policy: Policy | ChatPolicy,
    formatter: ChatFormatter | None = None,
    config: RunConfig | None = None,
    *,
    seeds: Sequence[int | None] | None = None,
    group_size: int = 1,
    max_concurrency: int | None = None,
    options: dict[str, Any] | None = None,
    episode_id_prefix: str = "ep",
) -> list[Trajectory]:
    """Play a batch of episodes concurrently; trajectories come back in job order.

    ``envs`` is one of:

    * a pool: a list of gem_core envs, or a :class:`~gem_core.vector.VectorEnv` (sync or async). Each
      episode takes a free env, resets it with its seed and gives it back when done. ``seeds`` says how
      many episode groups to play (default: one per env, unseeded).
    * env ids or :class:`EpisodeSpec`\\ s: one group per entry, each episode on a fresh env made for it
      (closed afterwards); the seed is the spec's, else ``seeds[i]``.

    ``group_size``: episodes per group, all reset with the group's seed, so they start from one state
    (an unseeded group draws one seed for all its members). Group ``g``'s episodes have ``group_id``
    ``"{prefix}{g}"`` and ``episode_id`` ``"{prefix}{g}"`` (``"{prefix}{g}-{m}"`` when ``group_size > 1``).
    ``max_concurrency`` bounds episodes in flight (a pool also bounds it by its size). ``config`` and the
    other arguments as :func:`run_episode`.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an integer >= 1 or None, got {max_concurrency!r}")
    config = RunConfig() if config is None else config
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    executor = config.executor
    pool, specs = _classify(envs, executor, config.step_in_thread)
    if specs is not None:
        if seeds is not None and len(seeds) != len(specs):
            raise ValueError(f"got {len(seeds)} seeds for {len(specs)} episode specs")
        groups = [(spec, spec.seed if spec.seed is not None else (None if seeds is None else seeds[g])) for g, spec in enumerate(specs)]
    else:
        if seeds is None:
            seeds = [None] * len(pool)
        groups = [(None, seed) for seed in seeds]
    jobs = []
    for g, (spec, seed) in enumerate(groups):
        if seed is None and group_size > 1:
            seed = secrets.randbits(31)  # one state for the whole group
        for m in range(group_size):
            jobs.append(_Job(len(jobs), g, m, seed, spec))
    if not jobs:
        return []
    limit = max_concurrency or len(jobs)
    if pool is not None:
        limit = min(limit, len(pool))
    gate = asyncio.Semaphore(limit)
    free: asyncio.Queue | None = None
    if pool is not None:
        free = asyncio.Queue()
        for slot in pool:
            free.put_nowait(slot)

    # A policy that batches in rounds (HFPolicy) is told how many episodes play, how many at once, and when each
    # ends: it then cuts a batch when every episode in play has asked, so batches do not depend on timing.
    open_cohort = getattr(policy, "open_cohort", None)
    cohort = open_cohort(len(jobs), limit) if callable(open_cohort) else None

    async def play(job: _Job) -> Trajectory:
        async with gate:
            episode_id = f"{episode_id_prefix}{job.group}" + (f"-{job.member}" if group_size > 1 else "")
            common = dict(seed=job.seed, options=options, episode_id=episode_id, group_id=f"{episode_id_prefix}{job.group}")
            try:
                if free is not None:
                    slot = await free.get()
                    try:
                        return await run_episode(slot, policy, formatter, config, **common)
                    finally:
                        free.put_nowait(slot)
                loop = asyncio.get_running_loop()
                spec = job.spec
                env = await loop.run_in_executor(executor, lambda: _make(spec))
                try:
                    return await run_episode(env, policy, formatter, config, env_id=spec.env_id, **common)
                finally:
                    env.close()
            finally:
                if cohort is not None:
                    cohort.episode_finished(episode_id)

    tasks = [asyncio.ensure_future(play(job)) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if cohort is not None:
            cohort.close()


def run_episodes_sync(*args: Any, **kwargs: Any) -> list[Trajectory]:
    """:func:`run_episodes` from synchronous code (starts and closes its own event loop)."""
    return asyncio.run(run_episodes(*args, **kwargs))


def _make(spec: EpisodeSpec) -> Env:
    from gem_core.registry import make

    return make(spec.env_id, **spec.env_kwargs)


def _classify(envs: Any, executor: Executor | None, step_in_thread: bool | str) -> tuple[list[Any] | None, list[EpisodeSpec] | None]:
    """(pool of AsyncEnvs, None) or (None, episode specs)."""
    from gem_core.vector.vector_env import VectorEnv

    if isinstance(envs, VectorEnvSlots):
        return list(envs.slots), None
    if isinstance(envs, VectorEnv):
        return list(VectorEnvSlots(envs, executor).slots), None
    if isinstance(envs, (str, EpisodeSpec, Env)):
        envs = [envs]
    items = list(envs)
    if not items:
        raise ValueError("run_episodes needs at least one env, env id or EpisodeSpec")
    if all(isinstance(item, (str, EpisodeSpec)) for item in items):
        return None, [item if isinstance(item, EpisodeSpec) else EpisodeSpec(item) for item in items]
    return [as_async_env(item, executor, step_in_thread) for item in items], None
