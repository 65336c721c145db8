"""ReBN in oat's ``PPOMultiTurnLearner`` (oat-llm 0.2.4, ``oat/algorithms/ppo_multiturn.py``).

Read in oat's code: without a critic (``critic_type`` other than ``"ppo"``), ``compute_advantages``
sets values to 0 and ``lam`` to 1, so each turn's advantage is its discounted return over the episode's
turns, ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}`` (``--gamma``). ``process_feedback_data`` then
flattens the episodes' transitions and, when there are more than ``rollout_batch_size_per_device``,
keeps a random subset of that many. ``learning_step`` with ``--whiten-adv`` normalises the advantages
over every device (all-reduced sum, sum of squares and count): population std (ddof 0), eps 1e-9.
Each transition's advantage multiplies every token of its response. That is ReBN
(:func:`gem_core.algo.rebn` with ``gamma``, ``ddof=0``, ``eps=1e-9``, no grouping), **normalised after
subsampling**: the statistics are those of the transitions kept on all devices.

:func:`rebn_args` sets those options. To normalise **before** subsampling (over every transition the
actors returned, on all devices), use :class:`GemLearner` with ``--gem-rebn-before-subsampling``; with
``rollout_batch_size_per_device`` at least the transitions per device, both are the same.

oat's whitening takes the std as ``sqrt(E[x^2] - mean^2)`` in float32: when every advantage of the
batch is equal, rounding can make that negative and every advantage NaN (five returns of 0.7 do).
:class:`GemLearner` whitens with the same statistics (population std over every device, eps 1e-9)
through gem_core's ReBN normalisation, where a constant batch gets advantage 0 (:func:`whiten`).
Episodes the infrastructure failed never reach the learner: the actor drops them and counts them
(:mod:`.actor`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner

from gem_core.algo import normalization_stats, normalize, rebn
from gem_integrations.oat.dataset import prepare_learner_data

OAT_EPS = 1e-9  # oat's whitening: (A - mean) / (std + 1e-9)


def rebn_args(args: Any, gamma: float | None = None) -> Any:
    """oat's learner options for ReBN, set on ``args`` (returned): no critic, ``lam`` 1, ``gamma``
    (when given), ``whiten_adv`` (off when normalising before subsampling: :class:`GemLearner` does it)."""
    if args.critic_type == "ppo":
        raise ValueError("ReBN has no critic: use --critic-type grpo or drgrpo (oat's learners without a critic), not ppo")
    if gamma is not None:
        args.gamma = float(gamma)
    if not 0.0 <= args.gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {args.gamma}")
    args.lam = 1.0
    args.whiten_adv = not getattr(args, "gem_rebn_before_subsampling", False)
    return args


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def whiten(advantages: Sequence[float], *, distributed: bool) -> np.ndarray:
    """oat's whitening of a learning batch's advantages (population std over every device's batch, eps
    1e-9), computed by gem_core's ReBN normalisation: a batch whose advantages are all equal gets 0, not
    oat's NaN. ``distributed``: statistics over every rank (each passes its own batch)."""
    values = np.asarray(advantages, dtype=np.float64).reshape(-1)
    stats = normalization_stats(values, ddof=0, distributed=distributed)
    return np.asarray(normalize(values, stats, eps=OAT_EPS), dtype=np.float32)


class GemLearner(PPOMultiTurnLearner):
    """oat's multi-turn learner; with ``args.gem_rebn_before_subsampling`` the advantages are ReBN over
    every transition of this step on all devices (:func:`gem_core.algo.rebn`, ``distributed=True``,
    ddof 0, eps 1e-9) before oat subsamples, and ``learning_step`` does not whiten again. Otherwise it
    is oat's learner, with oat's ``--whiten-adv`` done by :func:`whiten` (no NaN on a constant batch)."""

    def prepare_data(self, strategy: Any, tokenizer: Any) -> None:
        """oat's step loop sized from the GEM rows (:func:`~gem_integrations.oat.dataset.prepare_learner_data`),
        not from oat's ``--prompt-data`` (by default a TL;DR set downloaded from the hub, which the GEM actor
        never reads)."""
        prepare_learner_data(self, strategy)

    def learning_step(self, trajectory: Any) -> Any:
        if not self.args.whiten_adv:
            return super().learning_step(trajectory)
        whitened = whiten(trajectory["advantages"], distributed=_distributed())
        self.args.whiten_adv = False  # oat's own whitening would divide by its NaN std: done above
        try:
            return super().learning_step({**trajectory, "advantages": list(whitened)})
        finally:
            self.args.whiten_adv = True

    def process_feedback_data(self, data_list: Sequence[Sequence[Any]]) -> None:
        if not getattr(self.args, "gem_rebn_before_subsampling", False):
            return super().process_feedback_data(data_list)
        if self.args.whiten_adv:
            raise ValueError("--gem-rebn-before-subsampling normalises already: use rebn_args (whiten_adv off)")
        rewards = [[float(t.rewards) for t in episode] for episode in data_list]
        flat = np.asarray(rebn(rewards, gamma=self.args.gamma, ddof=0, eps=OAT_EPS, distributed=_distributed()), dtype=np.float32)
        per_episode, start = [], 0
        for episode in rewards:
            per_episode.append(flat[start : start + len(episode)])
            start += len(episode)
        queue = iter(per_episode)
        own = self.compute_advantages

        def normalised(episode_rewards: Any, values: Any, dones: Any, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
            advantages = next(queue)
            return advantages, advantages.copy()

        self.compute_advantages = normalised  # oat's loop, with these per-turn values
        try:
            return super().process_feedback_data(data_list)
        finally:
            self.compute_advantages = own
