"""The reference trainer (``gem-core train``): multi-turn policy gradient with the project's own rollout
runner, turn-aware batch and estimators, in PyTorch + transformers. See :mod:`gem_core.train.trainer`."""

from gem_core.train.trainer import ESTIMATORS, EpisodeStats, Rows, Trainer, TrainConfig, policy_loss, token_logprobs, training_rows, turn_advantages

__all__ = ["ESTIMATORS", "EpisodeStats", "Rows", "TrainConfig", "Trainer", "policy_loss", "token_logprobs", "training_rows", "turn_advantages"]
