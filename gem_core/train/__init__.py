"""The reference trainer (``gem-core train``): multi-turn policy gradient with the project's own rollout
runner, turn-aware batch and estimators, in PyTorch + transformers. See :mod:`gem_core.train.trainer`."""

from gem_core.train.config import ESTIMATORS, TrainConfig
from gem_core.train.loss import Rows, policy_loss, token_logprobs, training_rows, turn_advantages
from gem_core.train.trainer import EpisodeStats, Trainer

__all__ = ["ESTIMATORS", "EpisodeStats", "Rows", "TrainConfig", "Trainer", "policy_loss", "token_logprobs", "training_rows", "turn_advantages"]
