"""Trajectory: one episode as turns, with both training views (DESIGN.md contract 4).

* :meth:`Trajectory.per_turn_samples`: each turn its own sample (context at the start of the turn ->
  response), the GEM default.
* :meth:`Trajectory.as_sequence`: the whole episode as one sequence after the first prompt, model tokens
  (loss mask 1) interleaved with the tokens the environment added (loss mask 0), the verl/OpenRLHF
  agent-loop view.

Token ids are stored once: each turn keeps its response and the observation delta that followed it;
the context of turn ``t`` is the prompt plus everything before it (:meth:`Trajectory.context_ids`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gem_core.algo import discounted_returns

TRUNCATION_REASONS = ("context_limit", "max_turns", "abort", "env_error", "infra_error", "env")

#: ``Trajectory.infra_error`` of an episode whose request the engine aborted.
ENGINE_ABORTED = "the engine aborted the request"


def is_tool_turn(info: dict[str, Any]) -> bool:
    """Whether a step's observation is a tool's output: ``info["tool_turn"]`` (gem_core's ToolEnvWrapper)
    or ``info["use_tool"]`` (GEM's name)."""
    return bool(info.get("tool_turn") or info.get("use_tool"))


@dataclass
class Turn:
    """One turn: the model's response, what the env made of it, and the tokens the env added after it.

    ``context_len``: tokens in the context when the turn started (prompt and every earlier turn).
    ``response_ids``/``logprobs``: exactly what the policy returned (``logprobs`` may be ``None``).
    ``obs_delta_ids``: the template tokens appended after the response (closing, observation turn,
    generation prompt); empty on the last turn, whose observation is never shown to the model.
    ``response_text``: the decoded response; ``action``: the text the env received (thinking removed);
    ``observation``: what the env returned; ``message``: what the model was shown of it
    (:func:`gem_core.model_message`: the observation and ``info["suffix"]``), empty when the episode
    ended at this turn. ``info``: the env's step info, plus
    ``info["truncation_reason"]`` on the last turn of a truncated episode.
    """

    index: int
    context_len: int
    response_ids: list[int]
    logprobs: list[float] | None
    obs_delta_ids: list[int]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    response_text: str = ""
    action: str = ""
    observation: str = ""
    message: str = ""
    obs_images: int = 0  # images the observation delta added to the context (vision-language envs)

    @property
    def num_model_tokens(self) -> int:
        return len(self.response_ids)

    @property
    def is_tool_call(self) -> bool:
        """Whether this turn called a tool (:func:`is_tool_turn` of its info)."""
        return is_tool_turn(self.info)


class TurnSample(NamedTuple):
    """One turn as a training sample (tuple-like: unpack the first fields directly)."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    reward: float
    turn_index: int
    return_: float
    episode_id: str
    group_id: str | None
    env_id: str | None
    finish_reason: str
    terminated: bool
    truncated: bool


@dataclass(frozen=True)
class SequenceView:
    """The episode as one sequence after the first prompt.

    ``response_ids``: every turn's response followed by its observation delta. ``loss_mask``: 1 exactly
    on model tokens. ``logprobs``: aligned with ``response_ids``, 0.0 on env tokens (``None`` if the
    policy reported none). ``turn_ids``: the turn each token belongs to (env tokens: the turn they follow).
    ``reward_positions``: index of each turn's last model token, where its reward goes. ``rewards``: one
    per turn.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    turn_ids: list[int]
    reward_positions: list[int]
    rewards: list[float]

    def token_rewards(self) -> list[float]:
        """Per-token rewards: each turn's reward on its last model token, 0 elsewhere."""
        out = [0.0] * len(self.response_ids)
        for position, reward in zip(self.reward_positions, self.rewards):
            out[position] += reward
        return out

    @property
    def input_ids(self) -> list[int]:
        """Prompt and response together (what a trainer feeds the model)."""
        return self.prompt_ids + self.response_ids


@dataclass
class Trajectory:
    """One episode. ``episode_id`` is unique in a batch; ``group_id`` ties together the episodes that
    started from one env state (GRPO-style groups). ``initial_observation`` is what the env's reset
    returned, ``initial_message`` what the model was shown (:func:`gem_core.model_message`).
    ``truncation_reason`` is one of
    :data:`TRUNCATION_REASONS` when ``truncated``. ``infra_error`` is set (a one-line reason) when the
    infrastructure failed during the episode (the engine aborted a request: :data:`ENGINE_ABORTED`; a
    step's ``info["infra_error"]``: a sandbox or env worker died): the episode ends there, truncated, and
    trainers keep it out of the loss and the advantage statistics (DESIGN.md contract 8). ``token_mode`` is False for text-only (chat) policies,
    whose trajectories carry text and rewards but no token ids.
    """

    episode_id: str
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    env_id: str | None = None
    seed: int | None = None
    group_id: str | None = None
    initial_observation: str = ""
    initial_message: str = ""
    reset_info: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    token_mode: bool = True
    messages: list[dict[str, str]] | None = None  # text-only episodes: the conversation
    infra_error: str | None = None  # the infrastructure failed (not the policy): keep out of training
    images: list[Any] = field(default_factory=list)  # vision-language envs: every image of the context, in order

    # -- summaries ----------------------------------------------------------------------------------
    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def rewards(self) -> list[float]:
        """One reward per turn."""
        return [turn.reward for turn in self.turns]

    @property
    def episode_return(self) -> float:
        """Sum of the rewards (undiscounted)."""
        return float(sum(self.rewards))

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def success(self) -> bool:
        """The env's ``info["success"]`` on the last turn (False without turns)."""
        return bool(self.turns) and bool(self.turns[-1].info.get("success", False))

    def episode_summary(self) -> dict[str, Any]:
        """This episode in the ``info["episode"]`` format that :class:`gem_core.wrappers.EpisodeTotals` sums."""
        return {
            "return": self.episode_return,
            "length": self.num_turns,
            "success": self.success,
            "format_errors": sum(bool(turn.info.get("format_error")) for turn in self.turns),
            "invalid_actions": sum(bool(turn.info.get("invalid_action")) for turn in self.turns),
            "truncated": self.truncated and not self.terminated,
        }

    def returns(self, gamma: float = 1.0) -> list[float]:
        """Per-turn discounted returns over turns: ``G_t = r_t + gamma * G_{t+1}`` (:func:`gem_core.algo.discounted_returns`)."""
        rewards = [turn.reward for turn in self.turns]
        return discounted_returns([rewards], gamma=gamma).tolist() if rewards else []

    # -- token views ----------------------------------------------------------------------------------
    def full_ids(self) -> list[int]:
        """The whole context at the end: prompt, then every response and observation delta."""
        self._require_tokens()
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids.extend(turn.response_ids)
            ids.extend(turn.obs_delta_ids)
        return ids

    def context_ids(self, turn_index: int) -> list[int]:
        """The context the policy saw at the start of turn ``turn_index``."""
        self._require_tokens()
        turn = self.turns[turn_index]
        ids = list(self.prompt_ids)
        for earlier in self.turns[: turn.index]:
            ids.extend(earlier.response_ids)
            ids.extend(earlier.obs_delta_ids)
        if len(ids) != turn.context_len:
            raise AssertionError(f"turn {turn_index}: context has {len(ids)} tokens, recorded {turn.context_len}")
        return ids

    def context_images(self, turn_index: int | None = None) -> list[Any]:
        """The images in the context at the start of turn ``turn_index`` (default: at the end), in the
        order of their placeholder tokens: what the engine got as ``multi_modal_data["image"]``."""
        later = self.turns[turn_index:] if turn_index is not None else []
        return list(self.images[: len(self.images) - sum(turn.obs_images for turn in later)])

    def per_turn_samples(self, gamma: float = 1.0) -> list[TurnSample]:
        """Each turn as its own sample: (context at the turn's start, response, logprobs, reward, ...)."""
        self._require_tokens()
        returns = self.returns(gamma)
        samples = []
        context = list(self.prompt_ids)
        for turn, return_ in zip(self.turns, returns):
            samples.append(
                TurnSample(
                    prompt_ids=list(context),
                    response_ids=list(turn.response_ids),
                    logprobs=None if turn.logprobs is None else list(turn.logprobs),
                    reward=turn.reward,
                    turn_index=turn.index,
                    return_=return_,
                    episode_id=self.episode_id,
                    group_id=self.group_id,
                    env_id=self.env_id,
                    finish_reason=turn.finish_reason,
                    terminated=turn.terminated,
                    truncated=turn.truncated,
                )
            )
            context.extend(turn.response_ids)
            context.extend(turn.obs_delta_ids)
        return samples

    def as_sequence(self) -> SequenceView:
        """The whole episode as one sequence with a loss mask (see :class:`SequenceView`)."""
        self._require_tokens()
        response: list[int] = []
        mask: list[int] = []
        turn_ids: list[int] = []
        positions: list[int] = []
        have_logprobs = all(turn.logprobs is not None for turn in self.turns)
        logprobs: list[float] = []
        for turn in self.turns:
            if not turn.response_ids:
                raise ValueError(f"episode {self.episode_id}: turn {turn.index} has no model tokens to carry its reward")
            response.extend(turn.response_ids)
            mask.extend([1] * len(turn.response_ids))
            positions.append(len(response) - 1)
            response.extend(turn.obs_delta_ids)
            mask.extend([0] * len(turn.obs_delta_ids))
            turn_ids.extend([turn.index] * (len(turn.response_ids) + len(turn.obs_delta_ids)))
            if have_logprobs:
                logprobs.extend(turn.logprobs)  # type: ignore[arg-type]
                logprobs.extend([0.0] * len(turn.obs_delta_ids))
        return SequenceView(
            prompt_ids=list(self.prompt_ids),
            response_ids=response,
            loss_mask=mask,
            logprobs=logprobs if have_logprobs else None,
            turn_ids=turn_ids,
            reward_positions=positions,
            rewards=self.rewards,
        )

    # -- plumbing -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers, strings), e.g. for JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """The inverse of :meth:`to_dict`."""
        data = dict(data)
        data["turns"] = [Turn(**turn) for turn in data.get("turns", [])]
        return cls(**data)

    def _require_tokens(self) -> None:
        if not self.token_mode:
            raise ValueError(
                f"episode {self.episode_id} was played by a text-only (chat) policy: it has no token ids; "
                "use a token-level Policy and a ChatFormatter for training views"
            )
