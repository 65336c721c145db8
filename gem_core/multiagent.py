"""Multi-agent envs: several named agents take turns in one text episode (PettingZoo's AEC model, in text).

``reset(seed) -> (observations, info)`` gives each agent its first text (``{agent: text}``);
``current_agent`` says whose turn it is; ``step(action)`` applies that agent's action and returns
``(observations, rewards, terminated, truncated, info)``: the new text for each agent that receives
something, and a reward per agent (usually all of them, most 0). The episode ends for every agent at once.

Two ways to play one:

* :func:`gem_core.rollout.multiagent.run_multiagent_episode`: every agent played by a policy, one
  :class:`~gem_core.rollout.Trajectory` per agent (its own context, its own rewards), for training
  several agents or one agent against a model.
* :class:`AgentView`: one agent's side as a plain :class:`~gem_core.core.Env`; the other agents are played
  inside ``step`` by :class:`Simulator`\\ s. This is what makes a multi-agent env work wherever an env
  does (the registry, ``gem-core eval``, ``make-dataset``, every trainer plugin).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from gem_core.core import Env, SeededState
from gem_core.errors import INFRA_ERROR, GemError, ResetNeeded

MultiStepResult = tuple[dict[str, str], dict[str, float], bool, bool, dict[str, Any]]


class MultiAgentEnv(SeededState):
    """Base class of multi-agent text envs.

    Subclasses set ``agents`` and implement ``reset`` (calling ``super().reset(seed=seed)`` first, which
    seeds ``self.np_random``), ``current_agent`` and ``step``. Like :class:`~gem_core.core.Env`, bad
    actions never raise (a penalty and a message to the acting agent), the env owns its RNG, and
    ``get_state``/``set_state`` snapshot everything (the default deep-copies the instance's attributes).
    ``max_turns`` bounds the steps of all agents together.
    """

    agents: tuple[str, ...] = ()
    max_turns: int = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        """Start an episode; a seed reseeds this env's RNG. Returns the first text of each agent and info."""
        self._reseed(seed)
        return {}, {}

    @property
    def current_agent(self) -> str | None:
        """The agent whose action the next ``step`` takes; ``None`` once the episode is over."""
        raise NotImplementedError(f"{type(self).__name__} must implement current_agent")

    def step(self, action: str) -> MultiStepResult:
        """Apply the current agent's action: (new text per agent, reward per agent, terminated, truncated, info)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def sample_random_action(self) -> str:
        """A random, well-formed action of the current agent (tests and benchmarks)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample_random_action()")

    def default_simulators(self) -> dict[str, Simulator]:
        """The simulators :class:`AgentView` uses for agents it is not given one for (e.g. a scripted user)."""
        return {}


# ------------------------------------------------------------------------------------------------
# Simulators: an agent played inside AgentView.step.
# ------------------------------------------------------------------------------------------------


class Simulator:
    """Plays one agent of a multi-agent env: ``reset`` with the agent's first text and the reset info,
    then ``act(text) -> action`` each time it is the agent's turn (``text``: what the agent received since
    its last action, possibly empty).

    State (for ``AgentView.get_state``/``clone``) is the instance's attributes, deep-copied, except those
    named in ``shared`` (a policy, an engine, a connection): those are shared by copies, never copied.
    Simulators raise a :class:`~gem_core.errors.GemError` for a failure of their machinery (an endpoint
    that is down); :class:`AgentView` reports it as the episode's ``infra_error``.
    """

    shared: ClassVar[tuple[str, ...]] = ()

    def reset(self, observation: str, info: Mapping[str, Any]) -> None:
        """A new episode: ``observation`` is the agent's first text."""

    def act(self, observation: str) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement act()")

    def get_state(self) -> Any:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in self.shared})

    def set_state(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state))

    def clone(self) -> Simulator:
        new = copy.copy(self)
        new.set_state(self.get_state())
        return new


class CallableSimulator(Simulator):
    """A simulator from a function ``respond(text) -> action`` (stateless, or holding its own state)."""

    shared = ("respond",)

    def __init__(self, respond: Callable[[str], str]):
        self.respond = respond

    def act(self, observation: str) -> str:
        return self.respond(observation)


# ------------------------------------------------------------------------------------------------
# One agent's side as a plain Env.
# ------------------------------------------------------------------------------------------------


def join_texts(texts: list[str]) -> str:
    """What an agent is shown of several texts it received between two of its turns."""
    return "\n\n".join(text for text in texts if text)


class AgentView(Env[str, str]):
    """``agent``'s side of a :class:`MultiAgentEnv` as a single-agent :class:`~gem_core.core.Env`.

    ``others``: a :class:`Simulator` for each other agent (default: the env's ``default_simulators()``).
    ``reset`` and ``step`` play the other agents' turns until it is ``agent``'s turn again or the episode
    ends; the observation is everything ``agent`` received meanwhile (joined by blank lines), the reward
    the sum of its rewards. ``info`` is the last inner step's, plus ``agent_rewards`` (each agent's
    total over this step) and ``other_actions`` (what the simulators did, in order). A simulator that
    fails (:class:`~gem_core.errors.GemError`) ends the episode as truncated with ``info["infra_error"]``;
    when that happens during ``reset``, the next ``step`` (whatever its action) reports that end.
    """

    #: Not a ``\\boxed{}`` env: actions are messages and tool calls (the property tests read this).
    answer_format = "chat"

    def __init__(self, env: MultiAgentEnv, agent: str = "assistant", others: Mapping[str, Simulator] | None = None):
        if not isinstance(env, MultiAgentEnv):
            raise TypeError(f"AgentView needs a MultiAgentEnv, got {type(env).__name__}")
        if agent not in env.agents:
            raise ValueError(f"agent {agent!r} is not one of {env.agents}")
        simulators = {**env.default_simulators(), **dict(others or {})}
        missing = [a for a in env.agents if a != agent and a not in simulators]
        if missing:
            raise ValueError(f"AgentView({agent!r}) needs a simulator for {missing}; pass others={{name: Simulator}}")
        for name, simulator in simulators.items():
            if not callable(getattr(simulator, "act", None)):
                raise TypeError(f"the simulator for {name!r} has no act(text) method: {type(simulator).__name__}")
        self.multi_env = env
        self.agent = agent
        self.others = {a: simulators[a] for a in env.agents if a != agent}
        self._pending: dict[str, list[str]] = {}
        self._done = True
        self._started = False
        self._ended_at_reset: tuple[bool, bool, dict[str, Any]] | None = None
        self._carry = 0.0

    @property
    def max_turns(self) -> int:
        return self.multi_env.max_turns

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observations, info = self.multi_env.reset(seed=seed, options=options)
        self._pending = {a: [] for a in self.multi_env.agents}
        self._receive(observations)
        for name, simulator in self.others.items():
            simulator.reset(join_texts(self._pending[name]), info)
            self._pending[name] = []
        self._done, self._started = False, True
        rewards, terminated, truncated, info = self._play_others(info)
        observation = self._take(self.agent) or "(the episode has started)"
        info = {**info, "agent_rewards": rewards}
        # a reward earned before our first move comes with our first step (reset has no reward)
        self._carry = rewards[self.agent]
        # the others ended it before our first move (e.g. a simulator failed): the first step reports the end
        self._ended_at_reset = (bool(terminated), bool(truncated and not terminated), info) if terminated or truncated else None
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._ended_at_reset is not None:
            terminated, truncated, info = self._ended_at_reset
            self._ended_at_reset, self._done = None, True
            return "(the episode is over)", self._carry, terminated, truncated, {**info, "other_actions": []}
        if self._done:
            what = "before reset()" if not self._started else "on a finished episode"
            raise ResetNeeded(f"{type(self).__name__}.step() called {what}; call reset() first")
        observations, rewards, terminated, truncated, info = self.multi_env.step(action)
        totals = {a: float(rewards.get(a, 0.0)) for a in self.multi_env.agents}
        totals[self.agent] += self._carry
        self._carry = 0.0
        self._receive(observations)
        others: list[dict[str, str]] = []
        if not (terminated or truncated):
            more, terminated, truncated, info = self._play_others(info, others)
            for a, r in more.items():
                totals[a] += r
        self._done = terminated or truncated
        observation = self._take(self.agent)
        if not observation:
            observation = "(the episode is over)" if self._done else "(no new message)"
        info = {**info, "agent_rewards": totals, "other_actions": others}
        return observation, totals[self.agent], bool(terminated), bool(truncated and not terminated), info

    def _play_others(self, info: dict[str, Any], log: list[dict[str, str]] | None = None) -> tuple[dict[str, float], bool, bool, dict[str, Any]]:
        """Step the other agents until it is our turn or the episode ends; their rewards summed per agent."""
        totals = {a: 0.0 for a in self.multi_env.agents}
        terminated = truncated = False
        while True:
            current = self.multi_env.current_agent
            if current is None or current == self.agent:
                return totals, terminated, truncated, info
            simulator = self.others[current]
            try:
                action = simulator.act(self._take(current))
            except GemError as exc:  # the simulator's machinery failed (an endpoint): not our agent's doing
                return totals, False, True, {**info, INFRA_ERROR: f"the {current} simulator failed: {exc}", "truncation_reason": "infra_error"}
            if log is not None:
                log.append({"agent": current, "action": action if isinstance(action, str) else repr(action)})
            observations, rewards, terminated, truncated, info = self.multi_env.step(action)
            for a in totals:
                totals[a] += float(rewards.get(a, 0.0))
            self._receive(observations)
            if terminated or truncated:
                return totals, terminated, truncated, info

    def _receive(self, observations: Mapping[str, str]) -> None:
        for name, text in observations.items():
            if name in self._pending and isinstance(text, str) and text:
                self._pending[name].append(text)

    def _take(self, name: str) -> str:
        text = join_texts(self._pending.get(name, []))
        self._pending[name] = []
        return text

    def sample_random_action(self) -> str:
        return self.multi_env.sample_random_action()

    def oracle_action(self) -> str:
        """The env's scripted solution's next action for this agent, where the env has one."""
        oracle = getattr(self.multi_env, "oracle_action", None)
        if oracle is None:
            raise AttributeError(f"{type(self.multi_env).__name__} has no oracle_action()")
        return oracle()

    def state_text(self) -> str | None:
        return None

    def close(self) -> None:
        self.multi_env.close()

    # -- randomness and state: the multi-agent env's, plus the simulators' and what is pending ---------------
    @property
    def np_random(self) -> np.random.Generator:  # type: ignore[override]
        return self.multi_env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.multi_env.np_random = value

    @property
    def np_random_seed(self) -> int | None:  # type: ignore[override]
        return self.multi_env.np_random_seed

    def get_state(self) -> Any:
        return {
            "env": self.multi_env.get_state(),
            "others": {name: simulator.get_state() for name, simulator in self.others.items()},
            "pending": copy.deepcopy(self._pending),
            "done": self._done,
            "started": self._started,
            "ended_at_reset": copy.deepcopy(self._ended_at_reset),
            "carry": self._carry,
        }

    def set_state(self, state: Any) -> None:
        self.multi_env.set_state(state["env"])
        for name, simulator in self.others.items():
            simulator.set_state(state["others"][name])
        self._pending = copy.deepcopy(state["pending"])
        self._done, self._started = state["done"], state["started"]
        self._ended_at_reset = copy.deepcopy(state["ended_at_reset"])
        self._carry = state["carry"]

    def clone(self) -> AgentView:
        new = copy.copy(self)
        new.multi_env = self.multi_env.clone()
        new.others = {name: simulator.clone() for name, simulator in self.others.items()}
        new._pending = copy.deepcopy(self._pending)
        return new
