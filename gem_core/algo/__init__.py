"""Advantage estimators for multi-turn RL: ReBN and the baselines it is compared with.

Framework-neutral: numpy arrays in -> numpy out, torch tensors in -> torch out (torch is imported
only when a tensor arrives; the maths runs once, in float64 numpy). Everything is turn-level:
returns are discounted over turns, not tokens, and `tokens` maps per-turn advantages onto a
trainer's (batch, length) token tensors. The estimator reads top to bottom in `rebn.py`: `rebn`
(returns, statistics, division), then `group_stats` (count, mean, std) and `standardise`.
"""

from .baselines import grpo, reinforce, reinforce_batch_mean, rloo
from .estimators import DEFAULT_GAMMA, ESTIMATOR_NAMES, ESTIMATORS, GROUP_ESTIMATORS, Estimator, estimate
from .gae import turn_gae
from .rebn import NormStats, normalization_stats, normalize, rebn
from .returns import EpisodeLayout, discounted_returns, flatten_episodes
from .tokens import (
    broadcast_turns_to_tokens,
    rebn_token_level,
    turn_ids_from_mask,
    turn_ids_from_spans,
)

__all__ = [
    "DEFAULT_GAMMA",
    "ESTIMATORS",
    "ESTIMATOR_NAMES",
    "Estimator",
    "GROUP_ESTIMATORS",
    "estimate",
    "EpisodeLayout",
    "NormStats",
    "broadcast_turns_to_tokens",
    "discounted_returns",
    "flatten_episodes",
    "grpo",
    "normalization_stats",
    "normalize",
    "rebn",
    "rebn_token_level",
    "reinforce",
    "reinforce_batch_mean",
    "rloo",
    "turn_gae",
    "turn_ids_from_mask",
    "turn_ids_from_spans",
]
