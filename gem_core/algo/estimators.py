"""The advantage estimators by name: what ``gem-core train --estimator``, the experiment file's
``algorithm.estimator`` and the trainers' plugins choose from.

Each entry is one function from a batch's per-turn rewards (a list per episode) and each episode's group to
one advantage per turn (flat, episodes in order), with the options it takes and their defaults stated once:

- ``rebn``: A_t = (G_t - mean(G)) / (std(G) + eps) over every turn of the batch, G_t the return discounted over
  turns by ``gamma``; population std (ddof 0), eps 1e-6 (:func:`gem_core.algo.rebn`).
- ``reinforce``: A_t = G_t (:func:`gem_core.algo.reinforce`).
- ``grpo``: each turn gets its episode's return standardised within its group; ``drgrpo``: the same without the
  division by the group's std; ``rloo``: its return minus the mean of the others' in its group. These take no
  gamma (an episode's whole return) and need groups of 2+ episodes from one start state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .baselines import grpo, reinforce, rloo
from .rebn import rebn

#: The discount over turns where gem-core chooses it (gem-core train, the experiment file, the plugins' own
#: defaults): the GEM paper's 0.9. A trainer's own config keeps its own meaning where it sets one.
DEFAULT_GAMMA = 0.9


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator: ``advantages(rewards, groups, gamma)``; ``grouped``: needs groups of 2+;
    ``discounted``: uses ``gamma``; ``options``: its fixed settings, as documented above."""

    name: str
    advantages: Callable[[list[list[float]], list[Any], float], Any]
    grouped: bool
    discounted: bool
    options: dict[str, Any] = field(default_factory=dict)


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("rebn", lambda r, g, gamma: rebn(r, gamma=gamma, eps=1e-6, ddof=0), grouped=False, discounted=True, options={"eps": 1e-6, "ddof": 0}),
        Estimator("reinforce", lambda r, g, gamma: reinforce(r, gamma=gamma), grouped=False, discounted=True),
        Estimator("grpo", lambda r, g, gamma: grpo(r, group_by=g), grouped=True, discounted=False),
        Estimator("drgrpo", lambda r, g, gamma: grpo(r, group_by=g, scale_by_std=False), grouped=True, discounted=False, options={"scale_by_std": False}),
        Estimator("rloo", lambda r, g, gamma: rloo(r, group_by=g), grouped=True, discounted=False),
    )
}
#: The estimators' names, in the order the docs list them.
ESTIMATOR_NAMES: tuple[str, ...] = tuple(ESTIMATORS)
#: The estimators that compare the episodes of one start state (they need groups of 2+).
GROUP_ESTIMATORS: tuple[str, ...] = tuple(name for name, e in ESTIMATORS.items() if e.grouped)


def estimate(rewards: Sequence[Sequence[float]], groups: Sequence[Any], estimator: str, gamma: float = DEFAULT_GAMMA) -> np.ndarray:
    """One advantage per turn (flat, float64, episodes in order) by the estimator named ``estimator``."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}: one of {', '.join(ESTIMATOR_NAMES)}")
    flat = ESTIMATORS[estimator].advantages([list(episode) for episode in rewards], list(groups), gamma)
    return np.asarray(flat, dtype=np.float64)
