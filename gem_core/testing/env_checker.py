"""An env checker in the spirit of Gymnasium's ``check_env``: the API contract, and what the model sees.

:func:`check_env` checks one env's contract (text observations, or text with images, a ``str`` suffix, rewards and flags of
the right types, bad actions answered not raised, seeded resets reproducible, ``get_state``/``set_state``
round-trips). :func:`check_model_context` plays episodes through the real rollout runner and the
chat template, and asserts at every turn that the state the next move needs
(``env.state_text()``, else the observation) is in the newest message of the model's context, after
reset and after every step. Run both on every registered id (``tests/envs/test_env_checker.py``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import Any

from gem_core.core import Env, model_message
from gem_core.multimodal import IMAGE_PLACEHOLDER, MultimodalObservation, observation_text
from gem_core.rollout.chat import ChatFormatter
from gem_core.rollout.policy import Generation, SamplingParams
from gem_core.rollout.runner import RunConfig, run_episode

#: The hostile or malformed actions every env must answer without raising.
BAD_ACTIONS: tuple[Any, ...] = ("", "no box here", "\\boxed{}", "\\boxed{" * 50, "\\boxed{\x00\ud800}", "\\boxed{" + "9" * 5000 + "}")


class EnvCheckError(AssertionError):
    """An env broke the contract; the message names the env, the seed and what was wrong."""


def check_env(env: Env, *, seed: int = 0, steps: int = 20) -> None:
    """Check one env's API contract; raises :class:`EnvCheckError` naming the first problem."""
    name = _name(env)
    obs, info = env.reset(seed=seed)
    _check_reset(name, obs, info)
    again, again_info = env.reset(seed=seed)
    if again != obs:
        raise EnvCheckError(f"{name}: reset(seed={seed}) twice gave different observations")
    state = env.get_state()
    for bad in BAD_ACTIONS:
        env.set_state(state)
        try:
            result = env.step(bad)
        except Exception as exc:  # the contract: bad actions are penalised, never raised
            raise EnvCheckError(f"{name}: step({bad[:30]!r}) raised {type(exc).__name__}: {exc}") from exc
        _check_step(name, result)
    env.set_state(state)
    action = env.sample_random_action()
    first = env.step(action)
    env.set_state(state)
    if env.step(action)[:4] != first[:4]:
        raise EnvCheckError(f"{name}: the same action from a restored state (set_state) gave a different step")
    env.reset(seed=seed)
    for _ in range(steps):
        result = env.step(_move(env))
        _check_step(name, result)
        if result[2] or result[3]:
            break


def check_model_context(
    env: Env,
    tokenizer: Any,
    *,
    seeds: Iterable[int] = (0,),
    max_turns: int = 12,
    oracle_every: int = 2,
    formatter: ChatFormatter | None = None,
) -> int:
    """Play episodes on ``env`` through :func:`~gem_core.rollout.run_episode` with the chat template of
    ``tokenizer`` and assert that the model's context holds what the next move needs.

    The policy plays the env's ``oracle_action`` every ``oracle_every`` turns and a random action
    otherwise, so boards change and rejected moves happen. At every turn it decodes the newest message
    of its context (the whole prompt at turn 0, the observation delta after that) and checks that
    ``env.state_text()`` (when the env has one) and :func:`~gem_core.model_message` of the last
    observation are in it (its text, for an observation with images: pass a ``VLChatFormatter`` as
    ``formatter``). Returns the number of turns checked.
    """
    formatter = ChatFormatter(tokenizer) if formatter is None else formatter
    checked = 0
    for seed in seeds:
        policy = _CheckingPolicy(env, formatter, oracle_every)
        asyncio.run(
            run_episode(env, policy, formatter, RunConfig(params=SamplingParams(max_tokens=4096), max_turns=max_turns, step_in_thread=False), seed=seed)
        )
        checked += policy.turns
    return checked


class _CheckingPolicy:
    """Answers with the env's own moves and checks, before each answer, what the context shows."""

    def __init__(self, env: Env, formatter: ChatFormatter, oracle_every: int):
        self.env = env
        self.formatter = formatter
        self.oracle_every = max(1, oracle_every)
        self.turns = 0
        self.previous_length = 0
        self.last_message: str | None = None

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "", multi_modal_data: dict | None = None) -> Generation:
        newest = self.formatter.decode(prompt_ids[self.previous_length :])
        name = _name(self.env)
        state = self.env.state_text()
        if state is not None and state not in newest:
            raise EnvCheckError(
                f"{name}, turn {self.turns}: the board/state the next move needs is not in the model's newest message.\nstate:\n{state}\nmessage:\n{newest}"
            )
        # an observation's images are their tokens in the context: its text around each placeholder must be there
        pieces = [] if self.last_message is None else [p for p in self.last_message.split(IMAGE_PLACEHOLDER) if p]
        if self.last_message is not None and not _in_order(pieces, newest):
            raise EnvCheckError(f"{name}, turn {self.turns}: model_message(observation, info) is not in the newest message:\n{newest}")
        self.turns += 1
        unwrapped = self.env.unwrapped
        use_oracle = self.turns % self.oracle_every == 0 and hasattr(unwrapped, "oracle_action")
        action = unwrapped.oracle_action() if use_oracle else self.env.sample_random_action()
        ids = self.formatter.encode(str(action)) + [self.formatter.stop_token_ids[0]]
        self.previous_length = len(prompt_ids) + len(ids)
        self._watch()
        return Generation(ids[: params.max_tokens], None, "stop")

    def _watch(self) -> None:
        """Record what the next step's message must contain: wrap the env's step once."""
        env = self.env
        if getattr(env, "_checker_watched", False):
            return
        original = env.step
        policy = self

        def step(action: Any) -> Any:
            result = original(action)
            obs, _, terminated, truncated, info = result
            policy.last_message = None if (terminated or truncated) else observation_text(model_message(obs, info))
            return result

        env.step = step  # type: ignore[method-assign]
        env._checker_watched = True  # type: ignore[attr-defined]


def _in_order(pieces: list[str], text: str) -> bool:
    """Whether every piece occurs in ``text``, each after the one before it."""
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def _check_reset(name: str, obs: Any, info: Any) -> None:
    if not isinstance(obs, (str, MultimodalObservation)):
        raise EnvCheckError(f"{name}: reset returned a {type(obs).__name__} observation, not text (or a MultimodalObservation)")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{name}: reset returned a {type(info).__name__} info, not a dict")
    if not isinstance(info.get("suffix", ""), str):
        raise EnvCheckError(f"{name}: info['suffix'] is a {type(info['suffix']).__name__}, not text")


def _check_step(name: str, result: Any) -> None:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvCheckError(f"{name}: step must return (obs, reward, terminated, truncated, info), got {type(result).__name__}")
    obs, reward, terminated, truncated, info = result
    _check_reset(name, obs, info)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvCheckError(f"{name}: reward must be a finite number, got {reward!r}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise EnvCheckError(f"{name}: terminated/truncated must be bools, got {terminated!r}, {truncated!r}")
    if terminated and truncated:
        raise EnvCheckError(f"{name}: an episode is either terminated or truncated, not both")


def _move(env: Env) -> Any:
    return env.sample_random_action()


def _name(env: Env) -> str:
    spec = env.spec
    return spec.id if spec is not None else type(env.unwrapped).__name__
