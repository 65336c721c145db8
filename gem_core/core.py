"""The Env and Wrapper API: Gymnasium-shaped, text in and text out.

``reset(seed) -> (obs, info)`` and ``step(action) -> (obs, reward, terminated, truncated, info)``.
Actions are strings. Each env owns its RNG (``self.np_random``); no global random state is touched.
A time limit gives ``truncated=True, terminated=False``. Every env can snapshot and restore its state
(``get_state``/``set_state``) so that a group of episodes (GRPO-style) can start from one state.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Protocol, SupportsFloat, TypeVar

import numpy as np

from gem_core.multimodal import MultimodalObservation

ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")

StepResult = tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]

# Attributes that are never part of an env's state snapshot: they are identity, not state.
_NOT_STATE = frozenset({"spec"})

_MASK64 = (1 << 64) - 1


class Spec(Protocol):
    """What an env knows of how it was made: :class:`gem_core.registry.EnvSpec` (set by ``gem_core.make``).
    The registry sits above this module, so the env sees its spec through this shape only."""

    id: str
    kwargs: dict[str, Any]

    def make(self) -> Env: ...


#: The most characters a registered env shows the model at once (``model_message(obs, info)`` after a reset
#: or a step), for any kwargs within their declared ranges and any action: boards are bounded by those
#: ranges, and an env quotes model text back through ``gem_core.parsing.echo`` (at most
#: ``ECHO_CHARS`` characters and the length). tests/envs/test_env_properties.py checks it for every id.
MAX_OBSERVATION_CHARS = 8192

SUFFIX_KEY = "suffix"
SUFFIX_SEPARATOR = "\n\n"


def model_message(observation: str | MultimodalObservation, info: Mapping[str, Any] | None) -> str | MultimodalObservation:
    """What the model is shown for an observation: the observation, then ``info["suffix"]``.

    GEM's convention: an env may keep the current board (or the word pattern, the words found, the
    request for the next move) in ``info["suffix"]`` rather than in the observation. This is the one
    rule that turns the two into the text of the model's next message; the runner, every trainer
    plugin, ``make-dataset`` and the wrappers use it:

    * no suffix (missing, ``None`` or only whitespace): the observation unchanged;
    * an observation that already ends with the suffix (a wrapper such as ``HistoryWrapper`` rendered
      it): unchanged, so the suffix is never shown twice;
    * otherwise the observation without its trailing newlines, a blank line (:data:`SUFFIX_SEPARATOR`),
      and the suffix without its leading and trailing newlines.

    A :class:`~gem_core.multimodal.MultimodalObservation` gets the same rule on its text; its images stay.
    """
    if isinstance(observation, MultimodalObservation):
        text = model_message(observation.text, info)
        return observation if text == observation.text else observation.with_text(text)
    if not isinstance(observation, str):
        raise TypeError(f"model_message needs a text observation, got {type(observation).__name__}")
    suffix = None if info is None else info.get(SUFFIX_KEY)
    if not isinstance(suffix, str):
        if suffix is not None:
            raise TypeError(f"info['suffix'] must be text, got {type(suffix).__name__}")
        return observation
    suffix = suffix.strip("\n")
    if not suffix.strip():
        return observation
    body = observation.rstrip()
    if body.endswith(suffix.rstrip()):
        return observation
    body = observation.rstrip("\n")
    return body + SUFFIX_SEPARATOR + suffix if body else suffix


def _splitmix64_words(seed: int, n: int) -> list[int]:
    """``n`` well-mixed 64-bit words from ``seed`` (splitmix64, the standard seeder of xorshift/PCG)."""
    words, x = [], seed & _MASK64
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        words.append(z ^ (z >> 31))
    return words


def seed_generator(generator: np.random.Generator | None, seed: int) -> np.random.Generator:
    """A PCG64 ``Generator`` in a state fixed by ``seed``, reusing ``generator``'s object when possible.

    ``np.random.default_rng(seed)`` costs ~12 us (SeedSequence hashing); envs reseed once per episode,
    so we expand the seed with splitmix64 and set the PCG64 state directly (~3 us). Same seed, same
    stream, on every machine; seeds must be non-negative integers, as numpy requires.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative integer, got {type(seed).__name__}")
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if seed > _MASK64:  # fold big seeds into 64 bits without losing their high bits
        folded = 0
        while seed:
            folded ^= seed & _MASK64
            seed >>= 64
        seed = folded
    if generator is None or type(generator.bit_generator) is not np.random.PCG64:
        generator = np.random.Generator(np.random.PCG64(0))
    s0, s1, i0, i1 = _splitmix64_words(seed, 4)
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (s0 << 64) | s1, "inc": ((i0 << 64) | i1) | 1},  # PCG needs an odd increment
        "has_uint32": 0,
        "uinteger": 0,
    }
    return generator


class SeededState:
    """What every env owns, a single-agent :class:`Env` or a :class:`gem_core.multiagent.MultiAgentEnv`: its
    spec, its declared kwargs, its own RNG (seeded by ``reset``), and a state snapshot (``get_state``/
    ``set_state``/``clone``; the default deep-copies the instance's attributes, RNG included)."""

    metadata: dict[str, Any] = {}
    spec: Spec | None = None
    #: The constructor's arguments with their types and ranges (name -> gem_core.params.Param), checked by
    #: ``make``/``make_vec`` before the env is built; a classmethod ``check_params(args)`` may add rules
    #: between arguments. Undeclared arguments are passed through unchecked.
    params: ClassVar[dict[str, Any]] = {}

    _np_random: np.random.Generator | None = None
    _np_random_seed: int | None = None

    def _reseed(self, seed: int | None) -> None:
        """A seed reseeds this env's own RNG; ``None`` keeps the current stream (what ``reset`` does first)."""
        if seed is not None:
            self._np_random = seed_generator(self._np_random, seed)
            self._np_random_seed = int(seed)

    def close(self) -> None:
        """Release resources (processes, sockets). Safe to call twice."""

    # -- randomness ------------------------------------------------------------------------------
    @property
    def np_random(self) -> np.random.Generator:
        """This env's RNG; created from OS entropy on first use if ``reset`` was never given a seed."""
        if self._np_random is None:
            self._np_random = np.random.default_rng()
        return self._np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._np_random = value

    @property
    def np_random_seed(self) -> int | None:
        """The last seed given to ``reset``, or ``None``."""
        return self._np_random_seed

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> Any:
        """A snapshot from which ``set_state`` restores this env exactly (RNG included)."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in _NOT_STATE})

    def set_state(self, state: Any) -> None:
        """Restore a snapshot taken by ``get_state``; the snapshot itself is not aliased."""
        self.__dict__.update(copy.deepcopy(state))

    def clone(self) -> Any:
        """An independent copy of this env in its current state."""
        new = copy.copy(self)
        new.__dict__ = {}
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k in _NOT_STATE})
        new.set_state(self.get_state())
        return new

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Env(SeededState, Generic[ObsType, ActType]):
    """A multi-turn text environment.

    Subclasses implement ``reset`` (calling ``super().reset(seed=seed)`` first, which seeds
    ``self.np_random``) and ``step``. They may override ``get_state``/``set_state`` for speed; the
    default snapshots the instance's attributes with ``copy.deepcopy``, RNG included.
    """

    # -- the API ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[ObsType, dict[str, Any]]:
        """Start a new episode. A seed reseeds this env's own RNG; ``None`` keeps the current stream."""
        self._reseed(seed)
        if type(self).reset is Env.reset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset()")
        return None  # type: ignore[return-value]  # subclasses return (obs, info) after calling this

    def step(self, action: ActType) -> StepResult:
        """Apply one action. Bad actions never raise: they are penalised and explained in obs/info."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def state_text(self) -> str | None:
        """The part of the current state that the next move needs and that can change during the
        episode (a board, a word pattern, the words still to find), as the env shows it to the model;
        ``None`` when every observation already says all of it (e.g. feedback on the last guess). The
        env checker asserts that this text reaches the model's context after reset and every step."""
        return None

    def sample_random_action(self) -> ActType:
        """A random action that is well formed for the current state (used by tests and benchmarks)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample_random_action()")

    def spawn(self, n: int, *, same_state: bool = True, seeds: list[int] | None = None) -> list[Env]:
        """``n`` independent envs, for a group of episodes.

        ``same_state=True`` copies the current state (the RNG too, so the copies behave identically
        until their actions differ). ``same_state=False`` gives fresh envs of the same spec, reset
        with ``seeds`` when given.
        """
        if n < 0:
            raise ValueError(f"spawn(n) needs n >= 0, got {n}")
        if same_state:
            return [self.clone() for _ in range(n)]
        if self.spec is None:
            raise ValueError("spawn(same_state=False) needs an env made by gem_core.make (it has no spec)")
        envs = [self.spec.make() for _ in range(n)]
        if seeds is not None:
            if len(seeds) != n:
                raise ValueError(f"spawn got {len(seeds)} seeds for n={n}")
            for env, seed in zip(envs, seeds):
                env.reset(seed=seed)
        return envs

    # -- plumbing --------------------------------------------------------------------------------
    @property
    def unwrapped(self) -> Env:
        """The innermost env under any wrappers."""
        return self

    def __str__(self) -> str:
        return f"<{type(self).__name__}{'<' + self.spec.id + '>' if self.spec else ''}>"


class Wrapper(Env[ObsType, ActType]):
    """Wraps an env to change one thing; everything else is delegated live.

    Attribute reads that the wrapper does not define go to the wrapped env at the time of the read
    (``__getattr__``), so a wrapper never holds stale copies of the inner env's attributes.
    """

    def __init__(self, env: Env):
        if not isinstance(env, Env):
            raise TypeError(f"Wrapper expects a gem_core Env, got {type(env).__name__}")
        self.env = env

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Private names are not forwarded (Gymnasium's rule),
        # and "env" itself must exist, or we'd recurse during unpickling.
        if name.startswith("_") or name == "env":
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[ObsType, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: ActType) -> StepResult:
        return self.env.step(action)

    def sample_random_action(self) -> ActType:
        return self.env.sample_random_action()

    def state_text(self) -> str | None:
        return self.env.state_text()

    def close(self) -> None:
        self.env.close()

    @property
    def np_random(self) -> np.random.Generator:  # type: ignore[override]
        return self.env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    @property
    def np_random_seed(self) -> int | None:  # type: ignore[override]
        return self.env.np_random_seed

    @property
    def spec(self) -> Spec | None:  # type: ignore[override]
        return self.env.spec

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    def get_state(self) -> Any:
        """Wrapper state (its own attributes) plus the inner env's state."""
        own = {k: v for k, v in self.__dict__.items() if k != "env"}
        return {"wrapper": copy.deepcopy(own), "env": self.env.get_state()}

    def set_state(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state["wrapper"]))
        self.env.set_state(state["env"])

    def clone(self) -> Env:
        new = copy.copy(self)
        new.__dict__ = dict(self.__dict__)
        new.env = self.env.clone()
        new.__dict__.update(copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "env"}))
        return new

    def __str__(self) -> str:
        return f"<{type(self).__name__}{self.env}>"

    __repr__ = __str__
