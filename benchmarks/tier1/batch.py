"""The recorded batch of the Tier 1 check, made deterministically from an experiment file.

What is recorded (:func:`record`, saved by :func:`save`, read back by :func:`load` in any trainer's Python):

* the episodes: the experiment's env (its first id, its ``make`` kwargs, its token and turn limits) played by
  scripted strategies (:data:`STRATEGIES`: binary search, which wins; hint-blind runs up or down, which end
  with partial credit; a badly formatted first answer, -0.1 at once), so episodes have different lengths and
  turns get positive and negative advantages; ``rollout.episodes_per_update`` of them (or ``episodes``), in
  groups of ``rollout.group_size`` sharing a start state, each member of a group another strategy;
* one episode flagged as failed by the infrastructure (``Trajectory.infra_error``, DESIGN.md contract 8):
  it must count in nothing;
* the weights: the reference model is the tiny test model (``gem_core.testing.build_tiny_model``, the seed
  the experiment's) and the actor is that model moved by a fixed random step (:data:`ACTOR_STEP`), so a KL
  term to the reference has a gradient; both saved as Hugging Face checkpoints (``ref/``, ``actor/``, the
  test tokenizer beside each);
* the rollout's log-probs: the actor's own log-probs at the played tokens plus fixed noise
  (:data:`LOGPROB_NOISE`), so old log-probs differ from the current ones and a trainer that takes them as
  its old policy has ratios away from 1 and clipping at work from its first step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from gem_core.experiment import Experiment
from gem_core.rollout.chat import ChatFormatter
from gem_core.rollout.policies import ScriptedPolicy
from gem_core.rollout.policy import SamplingParams
from gem_core.rollout.runner import RunConfig, run_episode
from gem_core.rollout.trajectory import Trajectory
from gem_core.testing import build_test_tokenizer, build_tiny_model
from gem_core.testing.golden import golden_respond

TEMPLATE = "qwen3"  # the test tokenizer's chat template
ACTOR_STEP = 0.02  # std of the fixed random step from the reference model to the actor
LOGPROB_NOISE = 0.15  # std of the noise added to the actor's log-probs to make the rollout's
INFRA_ERROR = "tier1: the sandbox worker died (flagged on purpose)"
INFRA_EPISODE = 3  # the index of the flagged episode (the second group's second member at group size 2)


def _hint_blind(first: int, step: int) -> Any:
    """Guesses ``first``, ``first + step``, ... whatever the hints say (GuessTheNumber)."""

    def respond(context: str) -> str:
        guesses = context.count("you guessed")
        return f"I guess \\boxed{{{first + step * guesses}}}."

    return respond


def _format_error(context: str) -> str:
    return "I think it is five."


#: name -> respond(decoded context) -> text. GuessTheNumber and Mastermind are played by gem_core's golden
#: policy (binary search / a consistent code); other envs get whatever the strategies' texts earn there.
STRATEGIES: dict[str, Any] = {
    "search": golden_respond,
    "down-from-10": _hint_blind(10, -1),
    "format-error": _format_error,
    "up-from-1": _hint_blind(1, 1),
}


@dataclasses.dataclass
class Recorded:
    """A recorded batch: the episodes (rollout log-probs in their turns), what made them, and where the
    weights are (``work/actor``, ``work/ref``)."""

    trajectories: list[Trajectory]
    strategies: list[str]
    work: Path
    experiment_toml: str

    @property
    def failed(self) -> list[bool]:
        return [t.infra_error is not None for t in self.trajectories]


def tokenizer() -> Any:
    return build_test_tokenizer(TEMPLATE)


def record(experiment: Experiment, work: str | Path, episodes: int | None = None) -> Recorded:
    """Play and save the batch of ``experiment`` into ``work`` (see the module docstring); a pure function
    of its arguments."""
    import torch

    from gem_core.experiment import to_toml

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    count = episodes or experiment.episodes_per_update
    group = experiment.group_size
    if count % group or count < 2 * group or count <= INFRA_EPISODE:
        raise ValueError(f"{count} episodes: a multiple of the group size {group}, two groups at least, more than {INFRA_EPISODE}")
    rng = np.random.default_rng([experiment.seed, 64])
    seeds = [int(s) for s in rng.integers(0, experiment.eval_seed_start, size=count // group)]
    names = list(STRATEGIES)
    strategies = [names[i % len(names)] for i in range(count)]
    trajectories = asyncio.run(_play(experiment, tok, seeds, strategies))
    flagged = trajectories[INFRA_EPISODE]
    flagged.infra_error, flagged.truncated, flagged.terminated, flagged.truncation_reason = INFRA_ERROR, True, False, "infra_error"

    ref = build_tiny_model(len(tok), seed=experiment.seed)
    actor = build_tiny_model(len(tok), seed=experiment.seed)
    generator = torch.Generator().manual_seed(experiment.seed + 1)
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(ACTOR_STEP * torch.randn(parameter.shape, generator=generator))
    for name, model in (("ref", ref), ("actor", actor)):
        model.save_pretrained(work / name)
        tok.save_pretrained(work / name)

    noise = np.random.default_rng([experiment.seed, 65])
    for trajectory in trajectories:
        current = _turn_logprobs(actor, trajectory)
        for turn, values in zip(trajectory.turns, current):
            turn.logprobs = [float(v + noise.normal(0.0, LOGPROB_NOISE)) for v in values]
    recorded = Recorded(trajectories, strategies, work, to_toml(experiment))
    save(recorded)
    return recorded


async def _play(experiment: Experiment, tok: Any, seeds: list[int], strategies: list[str]) -> list[Trajectory]:
    from gem_core.registry import make

    config = RunConfig(
        params=SamplingParams(max_tokens=experiment.max_turn_tokens, temperature=experiment.temperature),
        max_turns=experiment.max_turns or None,
        max_context_tokens=experiment.max_context_tokens or None,
        step_in_thread=False,
    )
    formatter = ChatFormatter(tok)
    out = []
    for i, name in enumerate(strategies):
        env = make(experiment.env_ids[0], **dict(experiment.env_kwargs))
        group = i // experiment.group_size
        try:
            out.append(
                await run_episode(
                    env,
                    ScriptedPolicy(tok, STRATEGIES[name]),
                    formatter,
                    config,
                    seed=seeds[group],
                    episode_id=f"tier1-{i}",
                    group_id=f"tier1-g{group}",
                    env_id=experiment.env_ids[0],
                )
            )
        finally:
            env.close()
    return out


def _turn_logprobs(model: Any, trajectory: Trajectory) -> list[list[float]]:
    """The model's log-probs of each turn's response tokens, in the episode's full context."""
    import torch

    ids = trajectory.full_ids()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for turn in trajectory.turns:
        start = turn.context_len
        out.append([float(logp[start + k - 1, token]) for k, token in enumerate(turn.response_ids)])
    return out


def save(recorded: Recorded) -> None:
    data = {"strategies": recorded.strategies, "experiment": recorded.experiment_toml, "trajectories": [t.to_dict() for t in recorded.trajectories]}
    (recorded.work / "batch.json").write_text(json.dumps(data))


def load(work: str | Path) -> Recorded:
    work = Path(work)
    data = json.loads((work / "batch.json").read_text())
    return Recorded([Trajectory.from_dict(t) for t in data["trajectories"]], data["strategies"], work, data["experiment"])


def summary(recorded: Recorded) -> dict[str, Any]:
    """What the batch holds: episodes, turns per episode, rewards, the flagged one."""
    return {
        "episodes": len(recorded.trajectories),
        "turns": [t.num_turns for t in recorded.trajectories],
        "returns": [round(t.episode_return, 4) for t in recorded.trajectories],
        "infra_failed": [i for i, failed in enumerate(recorded.failed) if failed],
    }
