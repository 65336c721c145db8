"""Multi-agent episodes: each agent of a :class:`~gem_core.multiagent.MultiAgentEnv` played by its own
policy, with its own context and its own :class:`~gem_core.rollout.Trajectory`.

:func:`run_multiagent_episode` is :func:`~gem_core.rollout.run_episode` for several agents. Each agent's
context holds only what that agent was shown (its first text, then everything it received between two of
its turns, as one observation delta) and its own responses, so each agent's trajectory has the shape of a
single-agent one and goes through the turn-aware batch and ReBN unchanged. A reward that reaches an agent
after its turn (the final reward, when another agent's step ends the episode) is added to that agent's
latest turn. ``train_agents`` picks the trajectories returned; every agent is played either way.

Simulators (``act(text) -> action``, see :class:`~gem_core.multiagent.Simulator`) play an agent inside
:class:`~gem_core.multiagent.AgentView`; :class:`PolicySimulator` makes one from any policy (a token-level
:class:`Policy` with a formatter, or a :class:`ChatPolicy`), :func:`endpoint_simulator` from an
OpenAI-compatible endpoint.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gem_core.errors import GemError, infra_error
from gem_core.multiagent import MultiAgentEnv, Simulator, join_texts
from gem_core.rollout.chat import ChatFormatter, strip_thinking
from gem_core.rollout.policies import OpenAIPolicy
from gem_core.rollout.policy import ChatPolicy, Generation, Policy, SamplingParams, is_context_refusal, request_id_for
from gem_core.rollout.runner import RunConfig, check_generation, record_turn, require_observation, truncate_episode
from gem_core.rollout.trajectory import ENGINE_ABORTED, Trajectory, Turn, is_tool_turn


@dataclass
class _Seat:
    """One agent's side of an episode: who plays it and what it has seen."""

    agent: str
    player: Any  # Policy, ChatPolicy or Simulator
    formatter: ChatFormatter | None
    config: RunConfig
    trajectory: Trajectory
    kind: str  # "tokens", "chat" or "simulator"
    context: list[int] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    pending_tool: bool = False  # everything pending is the output of this agent's own tool call
    pending_reward: float = 0.0  # rewards that arrived before this agent's first turn
    last_response: list[int] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return self.trajectory.turns


async def run_multiagent_episode(
    env: MultiAgentEnv,
    policies: Mapping[str, Policy | ChatPolicy | Simulator],
    formatters: ChatFormatter | Mapping[str, ChatFormatter] | None = None,
    config: RunConfig | Mapping[str, RunConfig] | None = None,
    *,
    train_agents: Iterable[str] | None = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    episode_id: str | None = None,
    group_id: str | None = None,
    env_id: str | None = None,
) -> dict[str, Trajectory]:
    """Play one episode of ``env`` with a player per agent; return ``{agent: Trajectory}`` for ``train_agents``.

    ``policies``: agent -> a token-level :class:`Policy` (needs a formatter), a text-level
    :class:`ChatPolicy`, or a :class:`~gem_core.multiagent.Simulator` (its turns are recorded as text).
    ``formatters``: one :class:`ChatFormatter` for every agent, or one per agent (each agent's own system
    prompt). ``config``: one :class:`RunConfig` or one per agent: each agent's sampling and limits
    (``max_turns``: that agent's turns; ``max_context_tokens``: its context). The episode ends, for every
    agent, when the env ends it, when the agent due to act has used its ``max_turns`` or has no room left
    in its context (``truncation_reason`` ``"max_turns"``/``"context_limit"``), or when the engine aborts
    (``infra_error`` on every trajectory). Env steps run in ``config.executor``'s threads unless
    ``step_in_thread`` is False (the first agent's config decides).

    Each agent's trajectory has ``episode_id`` ``"{episode_id}/{agent}"`` and ``group_id``
    ``"{group_id}/{agent}"`` (so a group's advantages are normalised per agent), and ``env_id``.
    ``train_agents``: the agents whose trajectories are returned (default: all).
    """
    agents = tuple(env.agents)
    missing = [a for a in agents if a not in policies]
    if missing:
        raise ValueError(f"no policy for agent(s) {missing}; the env's agents are {agents}")
    chosen = agents if train_agents is None else tuple(train_agents)
    unknown = [a for a in chosen if a not in agents]
    if unknown:
        raise ValueError(f"train_agents {unknown} are not agents of this env {agents}")
    configs = _per_agent(config, agents, RunConfig, "config", RunConfig())
    step_config = configs[agents[0]]
    episode_id = episode_id or uuid.uuid4().hex
    if env_id is None and env.spec is not None:
        env_id = env.spec.id

    loop = asyncio.get_running_loop()

    async def call(function: Callable[[], Any]) -> Any:
        if step_config.step_in_thread is False:
            return function()
        return await loop.run_in_executor(step_config.executor, function)

    observations, info = await call(lambda: env.reset(seed=seed, options=options))
    agent_formatters = _per_agent(formatters, agents, ChatFormatter, "formatters", None)
    seats: dict[str, _Seat] = {}
    for agent in agents:
        player = policies[agent]
        kind = "tokens" if hasattr(player, "generate") else "chat" if hasattr(player, "chat") else "simulator" if hasattr(player, "act") else ""
        if not kind:
            raise TypeError(f"the player of {agent!r} ({type(player).__name__}) has neither generate(), chat() nor act()")
        formatter = agent_formatters[agent]
        if kind == "tokens" and formatter is None:
            raise TypeError(f"agent {agent!r} is played by a token-level Policy: it needs a ChatFormatter (formatters=...)")
        cfg = configs[agent]
        if kind == "tokens":
            cfg = cfg.replace(params=formatter.sampling_params(cfg.params))
        trajectory = Trajectory(
            episode_id=f"{episode_id}/{agent}",
            prompt_ids=[],
            env_id=env_id,
            seed=seed,
            group_id=None if group_id is None else f"{group_id}/{agent}",
            reset_info=dict(info),
            token_mode=kind == "tokens",
        )
        seat = seats[agent] = _Seat(agent, player, formatter, cfg, trajectory, kind)
        first = observations.get(agent, "")
        require_observation(first, "reset")
        seat.pending = [first] if first else []
        if kind == "simulator":
            player.reset(first, info)
            trajectory.initial_observation = trajectory.initial_message = first
            seat.pending = []

    await _play(env, seats, call)
    return {agent: seats[agent].trajectory for agent in chosen}


async def _play(env: MultiAgentEnv, seats: dict[str, _Seat], call: Callable[[Callable[[], Any]], Coroutine[Any, Any, Any]]) -> None:
    while True:
        agent = env.current_agent
        if agent is None:
            return
        seat = seats[agent]
        if seat.config.max_turns is not None and len(seat.turns) >= seat.config.max_turns:
            return _end_all(seats, "max_turns")
        message = join_texts(seat.pending)
        tool = seat.pending_tool
        seat.pending, seat.pending_tool = [], False
        if not _open_turn(seat, message, tool):
            return _end_all(seats, "context_limit")
        index = len(seat.turns)
        context_len = len(seat.context)
        try:
            action, response_text, generation = await _respond(seat, message, request_id_for(seat.trajectory.episode_id, index), call)
        except Exception as exc:
            if not is_context_refusal(exc):
                raise
            return _end_all(seats, "context_limit")
        if generation is not None and (generation.finish_reason == "abort" or (seat.kind == "tokens" and not generation.token_ids)):
            return _end_all(seats, "abort", infra=ENGINE_ABORTED if generation.finish_reason == "abort" else None)
        observations, rewards, terminated, truncated, info = await call(lambda: env.step(action))
        tokens = seat.kind == "tokens"
        record_turn(
            seat.trajectory,
            index,
            (observations.get(agent, ""), float(rewards.get(agent, 0.0)) + seat.pending_reward, terminated, truncated, info),
            "stop" if generation is None else generation.finish_reason,
            response_text,
            action if isinstance(action, str) else repr(action),
            context_len=context_len if tokens else 0,
            response_ids=list(generation.token_ids) if tokens else None,
            logprobs=generation.logprobs if tokens else None,
        )
        if tokens:
            seat.last_response = list(generation.token_ids)
            seat.context.extend(generation.token_ids)
        seat.pending_reward = 0.0
        for other, reward in rewards.items():
            if other != agent and other in seats and reward:
                _credit(seats[other], float(reward))
        for name, text in observations.items():
            if name in seats and isinstance(text, str) and text:
                receiver = seats[name]
                # the tool role only when all the agent will be shown is its own tool call's output
                receiver.pending_tool = name == agent and is_tool_turn(info) and not receiver.pending
                receiver.pending.append(text)
        failure = infra_error(info)
        if failure is not None:
            return _end_all(seats, "env_error" if info.get("error") else "infra_error", infra=failure)
        if terminated or truncated:
            for other in seats.values():
                other.trajectory.terminated = bool(terminated)
                if other.turns:
                    other.turns[-1].terminated = bool(terminated)
                    if "success" in info:  # the outcome, on every agent's last turn (Trajectory.success reads it)
                        other.turns[-1].info["success"] = info["success"]
            if truncated:
                _end_all(seats, info.get("truncation_reason") or "max_turns")
            return


def _open_turn(seat: _Seat, message: str, tool: bool) -> bool:
    """Show the agent what it received since its last turn; False when its context has no room left."""
    trajectory = seat.trajectory
    first = not seat.turns
    if seat.kind == "simulator":
        if not first:
            seat.turns[-1].message = message
        return True
    if first:
        trajectory.initial_observation = trajectory.initial_message = message
    else:
        seat.turns[-1].message = message
    if seat.kind == "chat":
        if first:
            system = None if seat.formatter is None else seat.formatter.system_prompt
            trajectory.messages = ([] if system is None else [{"role": "system", "content": system}]) + [{"role": "user", "content": message}]
        else:
            trajectory.messages.append({"role": "tool" if tool else "user", "content": message})
        return True
    formatter, limit, room = seat.formatter, seat.config.max_context_tokens, seat.config.min_turn_tokens
    if first:
        seat.context = formatter.prompt_ids(message)
        trajectory.prompt_ids = list(seat.context)
        return limit is None or len(seat.context) + room <= limit
    delta = formatter.observation_ids(message, seat.last_response, formatter.tool_role if tool else "user")
    if limit is not None and len(seat.context) + len(delta) + room > limit:
        return False
    seat.turns[-1].obs_delta_ids = delta
    seat.context.extend(delta)
    return True


async def _respond(seat: _Seat, message: str, request_id: str, call: Callable) -> tuple[Any, str, Generation | None]:
    """(action, response text, the generation; None for a simulator) of the agent's turn."""
    params = seat.config.params
    if seat.kind == "simulator":
        action = await call(lambda: seat.player.act(message))
        return action, action if isinstance(action, str) else repr(action), None
    if seat.kind == "chat":
        generation = await seat.player.chat([dict(m) for m in seat.trajectory.messages], params, request_id=request_id)
        text = generation.text or ""
        if generation.finish_reason != "abort":
            seat.trajectory.messages.append({"role": "assistant", "content": text})
        action = seat.formatter.action_text(text) if seat.formatter is not None else strip_thinking(text)
        return action, text, generation
    limit = seat.config.max_context_tokens
    budget = params.max_tokens if limit is None else min(params.max_tokens, limit - len(seat.context))
    turn_params = params if budget == params.max_tokens else params.replace(max_tokens=budget)
    generation = await seat.player.generate(list(seat.context), turn_params, request_id=request_id)
    check_generation(generation, budget, seat.player)
    if generation.finish_reason == "abort" or not generation.token_ids:
        return "", "", generation
    text = seat.formatter.response_text(generation.token_ids)
    return seat.formatter.action_text(text), text, generation


def _credit(seat: _Seat, reward: float) -> None:
    """A reward that reached an agent outside its own step goes to its latest turn (or its first, later)."""
    if seat.turns:
        seat.turns[-1].reward += reward
    else:
        seat.pending_reward += reward


def _end_all(seats: Mapping[str, _Seat], reason: str, *, infra: str | None = None) -> None:
    """End the episode for every agent as truncated with ``reason``."""
    for seat in seats.values():
        if infra is not None:
            seat.trajectory.infra_error = infra
        truncate_episode(seat.trajectory, reason)


def _per_agent(value: Any, agents: Sequence[str], kind: type, what: str, default: Any) -> dict[str, Any]:
    """``value`` for every agent: one value shared, or a mapping agent -> value (missing agents: ``default``)."""
    if value is None or isinstance(value, kind):
        return {a: default if value is None else value for a in agents}
    if isinstance(value, Mapping):
        unknown = [a for a in value if a not in agents]
        if unknown:
            raise ValueError(f"{what} names {unknown}, not agents of this env {tuple(agents)}")
        return {a: value.get(a, default) for a in agents}
    raise TypeError(f"{what} must be a {kind.__name__} or a mapping agent -> {kind.__name__}, got {type(value).__name__}")


async def run_multiagent_episodes(
    make_env: Callable[[], MultiAgentEnv],
    policies: Mapping[str, Policy | ChatPolicy | Simulator],
    formatters: ChatFormatter | Mapping[str, ChatFormatter] | None = None,
    config: RunConfig | Mapping[str, RunConfig] | None = None,
    *,
    seeds: Sequence[int | None],
    group_size: int = 1,
    train_agents: Iterable[str] | None = None,
    episode_id_prefix: str = "ep",
) -> list[dict[str, Trajectory]]:
    """``group_size`` episodes per seed (a GRPO-style group: one start state), all concurrently, each on a
    fresh env from ``make_env`` (closed afterwards). Group ``g``'s episodes have ``episode_id``
    ``"{prefix}{g}"`` (``"{prefix}{g}-{m}"`` when ``group_size > 1``) and ``group_id`` ``"{prefix}{g}"``,
    each agent's suffixed as in :func:`run_multiagent_episode`. Simulators are stateful: give each
    episode its own (here, use token-level or chat policies; or play the episodes one by one)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    train_agents = None if train_agents is None else tuple(train_agents)

    async def one(group: int, member: int, seed: int | None) -> dict[str, Trajectory]:
        env = make_env()
        episode_id = f"{episode_id_prefix}{group}" + (f"-{member}" if group_size > 1 else "")
        try:
            return await run_multiagent_episode(
                env, policies, formatters, config, train_agents=train_agents, seed=seed, episode_id=episode_id, group_id=f"{episode_id_prefix}{group}"
            )
        finally:
            env.close()

    jobs = [one(g, m, seed) for g, seed in enumerate(seeds) for m in range(group_size)]
    return list(await asyncio.gather(*jobs))


# ------------------------------------------------------------------------------------------------
# Simulators over policies.
# ------------------------------------------------------------------------------------------------

_background: asyncio.AbstractEventLoop | None = None
_background_lock = threading.Lock()


def run_sync(coroutine: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """Run ``coroutine`` from synchronous code (an env's ``step``) on one shared event loop in a daemon
    thread, and wait for its result. Works whether or not the caller's thread runs a loop of its own."""
    global _background
    with _background_lock:
        if _background is None or _background.is_closed():
            _background = asyncio.new_event_loop()
            threading.Thread(target=_background.run_forever, name="gem-simulators", daemon=True).start()
        loop = _background
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)


class PolicySimulator(Simulator):
    """An agent played by any policy, synchronously (for :class:`~gem_core.multiagent.AgentView`).

    ``policy``: a token-level :class:`Policy` (with ``formatter``: its context is built as the runner builds
    one, never re-encoding its own tokens; the formatter's system prompt) or a :class:`ChatPolicy` (text
    messages; ``system_prompt`` first, else the optional ``formatter``'s). The agent's first text and everything it receives become user messages; its
    responses (thinking removed) are its actions. ``params``: sampling per message. When the context
    would exceed ``max_context_tokens`` (token-level) or the engine refuses it as too long, the simulator
    says ``give_up`` (e.g. the env's stop marker), or raises a :class:`~gem_core.errors.GemError` when
    ``give_up`` is None. The policy is shared by copies (``clone``); the conversation is copied.

    The policy runs on one shared background event loop (:func:`run_sync`): do not share a policy object
    that batches on its own event loop (``VLLMPolicy``) with episodes running on another loop at the same
    time; give the simulator its own instance over the same engine.
    """

    shared = ("policy", "formatter")

    def __init__(
        self,
        policy: Policy | ChatPolicy,
        formatter: ChatFormatter | None = None,
        *,
        params: SamplingParams | None = None,
        max_context_tokens: int | None = None,
        give_up: str | None = None,
        system_prompt: str | None = None,
        name: str = "sim",
    ):
        self.token_level = hasattr(policy, "generate")
        if not self.token_level and not hasattr(policy, "chat"):
            raise TypeError(f"PolicySimulator needs a Policy (generate) or a ChatPolicy (chat), got {type(policy).__name__}")
        if self.token_level and formatter is None:
            raise TypeError("a token-level Policy needs a ChatFormatter (formatter=...)")
        self.policy = policy
        self.formatter = formatter
        self.params = SamplingParams(max_tokens=256) if params is None else params
        if self.token_level:
            self.params = formatter.sampling_params(self.params)
        self.max_context_tokens = max_context_tokens
        self.give_up = give_up
        self.system_prompt = system_prompt if system_prompt is not None or formatter is None else formatter.system_prompt
        self.name = name
        self.first = ""
        self.context: list[int] = []
        self.messages: list[dict[str, str]] = []
        self.last_response: list[int] = []
        self.turn = 0
        self.episode = uuid.uuid4().hex

    def reset(self, observation: str, info: Mapping[str, Any]) -> None:
        self.first, self.context, self.messages, self.last_response, self.turn = observation, [], [], [], 0
        self.episode = uuid.uuid4().hex

    def act(self, observation: str) -> str:
        request_id = request_id_for(f"{self.name}-{self.episode}", self.turn)
        message = join_texts([self.first, observation]) if self.turn == 0 else observation
        self.turn += 1
        try:
            return self._token_turn(message, request_id) if self.token_level else self._chat_turn(message, request_id)
        except Exception as exc:
            if not is_context_refusal(exc):
                raise
            return self._stop(str(exc))

    def _token_turn(self, message: str, request_id: str) -> str:
        formatter = self.formatter
        assert formatter is not None
        if not self.context:
            self.context = formatter.prompt_ids(message)
        else:
            self.context.extend(formatter.observation_ids(message, self.last_response))
        budget = self.params.max_tokens
        if self.max_context_tokens is not None:
            budget = min(budget, self.max_context_tokens - len(self.context))
            if budget < 1:
                return self._stop(f"its context is full ({len(self.context)} of {self.max_context_tokens} tokens)")
        params = self.params if budget == self.params.max_tokens else self.params.replace(max_tokens=budget)
        generation = run_sync(self.policy.generate(list(self.context), params, request_id=request_id))
        if generation.finish_reason == "abort":
            raise SimulatorError(f"the {self.name} simulator's engine aborted its request")
        self.last_response = list(generation.token_ids)
        self.context.extend(generation.token_ids)
        return formatter.action_text(formatter.response_text(generation.token_ids))

    def _chat_turn(self, message: str, request_id: str) -> str:
        if not self.messages:
            self.messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        self.messages.append({"role": "user", "content": message})
        generation = run_sync(self.policy.chat([dict(m) for m in self.messages], self.params, request_id=request_id))
        if generation.finish_reason == "abort":
            raise SimulatorError(f"the {self.name} simulator's endpoint aborted its request")
        text = generation.text or ""
        self.messages.append({"role": "assistant", "content": text})
        return self.formatter.action_text(text) if self.formatter is not None else strip_thinking(text)

    def _stop(self, why: str) -> str:
        if self.give_up is None:
            raise SimulatorError(f"the {self.name} simulator cannot go on: {why}")
        return self.give_up


class SimulatorError(GemError, RuntimeError):
    """A simulator's policy could not answer (context full, engine abort); AgentView reports it as infra_error."""


def endpoint_simulator(
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    params: SamplingParams | None = None,
    system_prompt: str | None = None,
    give_up: str | None = None,
    timeout: float = 120.0,
    **policy_kwargs: Any,
) -> PolicySimulator:
    """A :class:`PolicySimulator` over an OpenAI-compatible chat endpoint (:class:`~gem_core.rollout.OpenAIPolicy`).
    ``system_prompt``: the simulated agent's system message, before its first text."""
    policy = OpenAIPolicy(base_url, model, api_key=api_key, timeout=timeout, **policy_kwargs)
    return PolicySimulator(policy, params=params, give_up=give_up, system_prompt=system_prompt, name="endpoint")
