"""The golden scenario: fixed envs and seeds, a scripted policy, the local test tokenizer.

Every trainer integration replays these episodes through its own code path and compares trajectories,
loss masks and per-token ReBN advantages with :func:`golden_scenario` (DESIGN.md, consistency tier).

What the episodes cover (with the default arguments):

* ``gtn-easy``: GuessTheNumber by binary search, a sparse win.
* ``gtn-default``: the first response is cut by ``max_tokens`` after its ``\\boxed{}`` answer, so it lacks
  ``<|im_end|>`` and the next observation delta closes the assistant turn; the game goes on and is won.
* ``gtn-hard``: the first response thinks aloud past ``max_tokens``: an unclosed ``<think>`` block, no
  action, a format error (-0.1) that ends the episode.
* ``mm-easy/a``, ``mm-easy/b``: one GRPO-style group of two Mastermind episodes from one state, dense
  rewards (the scripted policy is deterministic, so both play the same game).
* ``mm-hard``: Mastermind on a bigger code, stopped by ``max_context_tokens`` (truncated,
  ``"context_limit"``), every reward earned before the limit kept.
* ``gtn-python`` (when gem_core.tools is importable): GuessTheNumber with a Python tool; the first
  turn calls the tool, whose output comes back as a tool turn (``<tool_response>`` in the template).

The scripted policy (:func:`golden_respond`) reads only the decoded context, never hidden env state.

Settings: the ``"qwen3"`` test tokenizer (``gem_core.testing.build_test_tokenizer``), no system prompt,
``GOLDEN_PARAMS`` (``max_tokens=40``), ``GOLDEN_MAX_CONTEXT_TOKENS`` (460), and ReBN with ``gamma=0.9``,
``ddof=0`` (population std), ``eps=1e-6``, normalised over every turn of the batch (no grouping).

An integration replays it like this, with ``policy`` being its engine adapter around
``golden_policy(tokenizer)`` (or the scripted policy itself)::

    for episode in golden_scenario().episodes:
        env = make_golden_env(episode)
        trajectory = await run_episode(env, policy, golden_formatter(tokenizer), golden_config(),
                                       seed=episode.seed, episode_id=episode.episode_id,
                                       group_id=episode.group_id)

and compares ids, masks, logprobs, rewards and its per-token advantages with the reference.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gem_core.core import Wrapper
from gem_core.rollout.chat import ChatFormatter
from gem_core.rollout.policies import ScriptedPolicy
from gem_core.rollout.policy import SamplingParams
from gem_core.rollout.runner import RunConfig, run_episode
from gem_core.rollout.trajectory import SequenceView, Trajectory

GOLDEN_GAMMA = 0.9
GOLDEN_DDOF = 0
GOLDEN_EPS = 1e-6
GOLDEN_PARAMS = SamplingParams(max_tokens=40, temperature=1.0)
GOLDEN_MAX_CONTEXT_TOKENS = 460
GOLDEN_CHAT_TEMPLATE = "qwen3"


@dataclass(frozen=True)
class GoldenEpisode:
    """One episode of the scenario: env id, ``make`` kwargs, reset seed and the ids the runner uses."""

    env_id: str
    seed: int
    episode_id: str
    group_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: tuple[str, ...] = ()  # "python": the env is wrapped in ToolEnvWrapper with a PythonTool


GOLDEN_EPISODES: tuple[GoldenEpisode, ...] = (
    GoldenEpisode("game:GuessTheNumber-v0-easy", 0, "gtn-easy", "gtn-easy"),
    GoldenEpisode("game:GuessTheNumber-v0", 1, "gtn-default", "gtn-default"),
    GoldenEpisode("game:GuessTheNumber-v0-hard", 2, "gtn-hard", "gtn-hard"),
    GoldenEpisode("game:Mastermind-v0-easy", 0, "mm-easy/a", "mm-easy"),
    GoldenEpisode("game:Mastermind-v0-easy", 0, "mm-easy/b", "mm-easy"),
    GoldenEpisode("game:Mastermind-v0-hard", 11, "mm-hard", "mm-hard"),
)


def tool_episodes() -> tuple[GoldenEpisode, ...]:
    """The tool-env episodes: GuessTheNumber with a Python tool, whose first turn is a tool call (its
    result comes back as a tool turn). Empty when gem_core's tools are not importable."""
    try:
        from gem_core.tools import PythonTool  # noqa: F401
        from gem_core.wrappers import ToolEnvWrapper  # noqa: F401
    except ImportError:
        return ()
    return (GoldenEpisode("game:GuessTheNumber-v0-easy", 11, "gtn-python", "gtn-python", tools=("python",)),)


# ------------------------------------------------------------------------------------------------
# The scripted policy.
# ------------------------------------------------------------------------------------------------

_TURN_START, _TURN_END = "<|im_start|>", "<|im_end|>"
_GTN_RANGE = re.compile(r"Guess the number between (-?\d+) and (-?\d+)")
_GTN_HINT = re.compile(r"you guessed (-?\d+), and the target number is (higher|lower) than")
_MM_SETUP = re.compile(r"A secret code of (\d+) digits is hidden\. Each digit is between 1 and (\d+)")
_MM_FEEDBACK = re.compile(r"you guessed ([\d ]+): (\d+) black peg\(s\) and (\d+) white peg\(s\)")


def _user_turns(context: str) -> list[str]:
    """The bodies of the user and tool turns of a ChatML context, in order: what
    ``re.findall(r"<\\|im_start\\|>(?:user|tool)\\n(.*?)<\\|im_end\\|>", context, re.DOTALL)`` finds, in linear time."""
    turns: list[str] = []
    position = 0
    while (start := context.find(_TURN_START, position)) >= 0:
        body = start + len(_TURN_START) + len("user\n")
        if context[start + len(_TURN_START) : body] not in ("user\n", "tool\n"):
            position = start + 1
            continue
        end = context.find(_TURN_END, body)
        if end < 0:  # no end after this turn's start: none after a later one either
            break
        turns.append(context[body:end])
        position = end + len(_TURN_END)
    return turns


def golden_respond(context: str) -> str:
    """The scenario's policy: a pure function of the decoded context (only the user turns are read)."""
    observations = "\n".join(_user_turns(context))
    if "You are playing Guess The Number" in observations:
        return _guess_the_number(observations)
    if "You are playing Mastermind" in observations:
        return _mastermind(observations)
    return "I do not know this game. \\boxed{1}"


def _guess_the_number(observations: str) -> str:
    low, high = map(int, _GTN_RANGE.search(observations).groups())  # type: ignore[union-attr]
    if "You can run Python code" in observations and "<output>\n" not in observations:  # a Python tool: use it once
        return f"Let me compute the middle.\n<python>print(({low} + {high}) // 2)</python>"
    for guess, direction in _GTN_HINT.findall(observations):
        if direction == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    guess = (low + high) // 2
    candidates = ", ".join(str(n) for n in range(low, high + 1))
    if high - low + 1 > 40:  # thinks aloud first: long enough to be cut before the answer
        return f"<think>Still possible: {candidates}.</think>\nI guess \\boxed{{{guess}}}."
    if high - low + 1 > 12:  # answers first, then a list that max_tokens cuts
        return f"I guess \\boxed{{{guess}}}. Still possible: {candidates}."
    return f"I guess \\boxed{{{guess}}}."


def _mastermind(observations: str) -> str:
    length, top = map(int, _MM_SETUP.search(observations).groups())  # type: ignore[union-attr]
    repeats = "may repeat" in observations
    digits = range(1, top + 1)
    codes = itertools.product(digits, repeat=length) if repeats else itertools.permutations(digits, length)
    history = [(tuple(map(int, g.split())), int(b), int(w)) for g, b, w in _MM_FEEDBACK.findall(observations)]
    for code in codes:
        if all(_pegs(code, guess) == (black, white) for guess, black, white in history):
            return f"A code that fits every answer so far: \\boxed{{{' '.join(map(str, code))}}}"
    return "No code fits the answers. \\boxed{" + " ".join(["1"] * length) + "}"


def _pegs(secret: tuple[int, ...], guess: tuple[int, ...]) -> tuple[int, int]:
    black = sum(s == g for s, g in zip(secret, guess))
    common = sum(min(secret.count(d), guess.count(d)) for d in set(guess))
    return black, common - black


def golden_config(params: SamplingParams = GOLDEN_PARAMS, max_context_tokens: int = GOLDEN_MAX_CONTEXT_TOKENS) -> RunConfig:
    """The scenario's :class:`RunConfig` (steps inline, so the run is a pure function of its inputs)."""
    return RunConfig(params=params, max_context_tokens=max_context_tokens, step_in_thread=False)


def golden_policy(tokenizer: Any) -> ScriptedPolicy:
    """The scenario's :class:`ScriptedPolicy` on ``tokenizer``."""
    return ScriptedPolicy(tokenizer, golden_respond)


def golden_formatter(tokenizer: Any) -> ChatFormatter:
    """The scenario's :class:`ChatFormatter` (no system prompt, template defaults)."""
    return ChatFormatter(tokenizer)


def make_golden_env(episode: GoldenEpisode) -> Any:
    """A fresh env for one scenario episode (with its tools, if any)."""
    from gem_core.registry import make

    env = make(episode.env_id, **episode.env_kwargs)
    if "python" in episode.tools:
        from gem_core.wrappers import ToolEnvWrapper

        env = _WithoutTimings(ToolEnvWrapper(env, [_python_tool()]))
    return env


def _python_tool() -> Any:
    """A PythonTool in bubblewrap when that works here; else unisolated, which is safe because the only
    code it runs is the scripted policy's fixed arithmetic (and its output is the same)."""
    import warnings

    from gem_core.tools import PythonTool

    try:
        tool = PythonTool(workers=1)
    except Exception:
        tool = None
    if tool is not None:
        try:
            if tool.sandbox.run("print(1)").ok:
                return tool
        except Exception:
            pass
        tool.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return PythonTool(workers=1, isolation="none")


class _WithoutTimings(Wrapper):
    """Drops wall-clock durations from tool infos, so the scenario is a pure function."""

    def step(self, action: str) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        tool_info = info.get("tool_info")
        if isinstance(tool_info, dict) and "duration" in tool_info:
            info = {**info, "tool_info": {k: v for k, v in tool_info.items() if k != "duration"}}
        return obs, reward, terminated, truncated, info


# ------------------------------------------------------------------------------------------------
# The reference.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenScenario:
    """The reference every integration compares with.

    ``sequences[i]``/``loss_masks[i]``: episode ``i``'s sequence view and its mask. ``turn_advantages[i]``:
    ReBN per turn (``gamma``, ``ddof``, ``eps``; normalised over every turn of every episode, no
    grouping). ``token_advantages[i]``: those advantages on each token of ``sequences[i].response_ids``
    (each turn's value on its model tokens, 0.0 on env tokens); the per-turn sample view gives the turn's
    value on every token of that turn's response.
    """

    episodes: tuple[GoldenEpisode, ...]
    trajectories: list[Trajectory]
    sequences: list[SequenceView]
    loss_masks: list[list[int]]
    turn_returns: list[list[float]]
    turn_advantages: list[list[float]]
    token_advantages: list[list[float]]
    gamma: float
    ddof: int
    eps: float
    params: SamplingParams
    max_context_tokens: int

    def digest(self) -> dict[str, Any]:
        """A compact fingerprint per episode (rewards, lengths, sha256 of the token ids and mask,
        advantages rounded to 12 digits), for pinning the scenario in a small file."""
        out: dict[str, Any] = {"gamma": self.gamma, "ddof": self.ddof, "eps": self.eps, "episodes": {}}
        for trajectory, sequence, advantages in zip(self.trajectories, self.sequences, self.turn_advantages):
            payload = json.dumps([sequence.prompt_ids, sequence.response_ids, sequence.loss_mask, sequence.logprobs])
            out["episodes"][trajectory.episode_id] = {
                "rewards": trajectory.rewards,
                "finish_reasons": [turn.finish_reason for turn in trajectory.turns],
                "terminated": trajectory.terminated,
                "truncation_reason": trajectory.truncation_reason,
                "prompt_tokens": len(sequence.prompt_ids),
                "response_tokens": len(sequence.response_ids),
                "model_tokens": sum(sequence.loss_mask),
                "tokens_sha256": hashlib.sha256(payload.encode()).hexdigest(),
                "turn_advantages": [round(a, 12) for a in advantages],
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON comparisons."""
        return {
            "episodes": [vars(e) for e in self.episodes],
            "trajectories": [t.to_dict() for t in self.trajectories],
            "sequences": [vars(s) for s in self.sequences],
            "turn_returns": self.turn_returns,
            "turn_advantages": self.turn_advantages,
            "token_advantages": self.token_advantages,
            "gamma": self.gamma,
            "ddof": self.ddof,
            "eps": self.eps,
            "params": self.params.to_dict(),
            "max_context_tokens": self.max_context_tokens,
        }


def golden_scenario(
    *,
    gamma: float = GOLDEN_GAMMA,
    ddof: int = GOLDEN_DDOF,
    eps: float = GOLDEN_EPS,
    tokenizer: Any = None,
    episodes: tuple[GoldenEpisode, ...] | None = None,
    params: SamplingParams = GOLDEN_PARAMS,
    max_context_tokens: int = GOLDEN_MAX_CONTEXT_TOKENS,
) -> GoldenScenario:
    """Play the scenario and compute its reference values; a pure function of its arguments.

    ``tokenizer`` defaults to ``gem_core.testing.build_test_tokenizer("qwen3")``. The advantages are
    computed from both training views (per-turn rewards, and token-level rewards on the sequence view)
    and must agree, or this raises.
    """
    if tokenizer is None:
        from gem_core.testing import build_test_tokenizer

        tokenizer = build_test_tokenizer(GOLDEN_CHAT_TEMPLATE)
    if episodes is None:
        episodes = GOLDEN_EPISODES + tool_episodes()
    trajectories = asyncio.run(_play_all(episodes, tokenizer, params, max_context_tokens))
    sequences = [t.as_sequence() for t in trajectories]
    turn_advantages, token_advantages = rebn_from_both_views(trajectories, gamma=gamma, ddof=ddof, eps=eps)
    return GoldenScenario(
        episodes=tuple(episodes),
        trajectories=trajectories,
        sequences=sequences,
        loss_masks=[s.loss_mask for s in sequences],
        turn_returns=[t.returns(gamma) for t in trajectories],
        turn_advantages=turn_advantages,
        token_advantages=token_advantages,
        gamma=gamma,
        ddof=ddof,
        eps=eps,
        params=params,
        max_context_tokens=max_context_tokens,
    )


async def _play_all(episodes: tuple[GoldenEpisode, ...], tokenizer: Any, params: SamplingParams, max_context_tokens: int) -> list[Trajectory]:
    policy = golden_policy(tokenizer)
    formatter = golden_formatter(tokenizer)
    trajectories = []
    for episode in episodes:
        env = make_golden_env(episode)
        try:
            trajectories.append(
                await run_episode(
                    env,
                    policy,
                    formatter,
                    golden_config(params, max_context_tokens),
                    seed=episode.seed,
                    episode_id=episode.episode_id,
                    group_id=episode.group_id,
                    env_id=episode.env_id,
                )
            )
        finally:
            env.close()
    return trajectories


def rebn_from_both_views(
    trajectories: list[Trajectory], *, gamma: float, ddof: int, eps: float, tolerance: float = 1e-9
) -> tuple[list[list[float]], list[list[float]]]:
    """ReBN advantages (per turn, and per token of each sequence view), computed from the per-turn
    rewards and, independently, from token-level rewards on the sequence views; raises if they differ."""
    from gem_core.algo import broadcast_turns_to_tokens, rebn, rebn_token_level

    rewards = [t.rewards for t in trajectories]
    flat = np.asarray(rebn(rewards, gamma=gamma, ddof=ddof, eps=eps), dtype=np.float64)
    per_turn: list[list[float]] = []
    start = 0
    for episode_rewards in rewards:
        per_turn.append(flat[start : start + len(episode_rewards)].tolist())
        start += len(episode_rewards)

    sequences = [t.as_sequence() for t in trajectories]
    width = max(len(s.response_ids) for s in sequences)
    token_rewards = np.zeros((len(sequences), width))
    mask = np.zeros((len(sequences), width), dtype=bool)
    turn_ids = np.full((len(sequences), width), -1, dtype=np.int64)
    table = np.zeros((len(sequences), max(len(r) for r in rewards)))
    for i, sequence in enumerate(sequences):
        n = len(sequence.response_ids)
        token_rewards[i, :n] = sequence.token_rewards()
        mask[i, :n] = np.asarray(sequence.loss_mask, dtype=bool)
        turn_ids[i, :n] = sequence.turn_ids
        table[i, : len(per_turn[i])] = per_turn[i]
    from_sequence = rebn_token_level(token_rewards, mask, gamma=gamma, eps=eps, ddof=ddof)
    if isinstance(from_sequence, tuple):  # (advantages, returns) in some versions of gem_core.algo
        from_sequence = from_sequence[0]
    from_sequence = np.asarray(from_sequence, dtype=np.float64)
    from_turns = broadcast_turns_to_tokens(table, turn_ids, mask)
    if not np.allclose(from_sequence, from_turns, rtol=0.0, atol=tolerance):
        worst = float(np.max(np.abs(from_sequence - from_turns)))
        raise AssertionError(f"ReBN from the sequence view and from per-turn rewards differ by {worst:g}")
    token_level = [from_turns[i, : len(s.response_ids)].tolist() for i, s in enumerate(sequences)]
    return per_turn, token_level
