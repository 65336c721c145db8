"""A micro-batch with no action token in OpenRLHF 0.11.x's actor update: a patch of ``ActorPPOTrainer.training_step``.

The GEM agent file gives an episode the infrastructure failed a row with no action token
(:mod:`gem_integrations.openrlhf.rollout`: its ``action_mask`` is all 0), so that it carries no loss. At
``--train.micro_batch_size 1`` (OpenRLHF's default) that row is a micro-batch of its own, and OpenRLHF's
``ppo_train`` (``openrlhf/trainer/ray/ppo_actor.py``) then fails in two places, neither of them in its
training maths:

* **the metric averaging divides by zero.** ``ppo_train`` sums each metric of a micro-batch over the ranks
  (``strategy.all_reduce``), scaled by the micro-batch's action tokens for a metric whose weight is
  ``"token"`` (the losses, and every 0-D tensor in ``experience.info``: ``ppo_kl``, ``ppo_clip_ratio``,
  ``kl``, ``logprobs_diff``...), then divides by the summed tokens (``merged_status[k] = value / denom``): 0
  tokens on every rank is ``ZeroDivisionError`` and the trainer stops, on a rare infrastructure failure.
  With several ranks and only some holding such a row, it does not stop, but ``masked_mean`` over no
  token (``ppo_kl``, ``ppo_clip_ratio``, ``logprobs_diff``) is NaN, and NaN times 0 tokens is NaN in the sum
  on every rank: the logged metric is NaN for the whole update;
* **an optimizer step with no action token has a 0/0 loss.** ``iter_grad_accum_global_norm`` gives every
  micro-batch of a step the step's action tokens (``batch_num_tokens``) and rows with one
  (``global_batch_size``), summed over the ranks; ``aggregate_loss`` divides the masked sum by them, in both
  ``--actor.loss_agg_mode`` (``token-mean``, ``seq-mean-token-mean``) and for ``ppo`` and ``gspo``, and so
  do the KL and entropy terms. A step whose rows all failed (micro-batch 1 with ``--train.batch_size`` the
  world size, or a whole batch lost to a dead sandbox service) gets a NaN loss, NaN gradients and, through
  the optimizer, NaN weights. A micro-batch with no token in a step that has some is fine (its loss is 0).

What the patch does, and only for those cases (a micro-batch with an action token on every rank, in a step
with one, goes through unchanged: the same objects, the same numbers):

* **normalisers**: a ``batch_num_tokens`` or ``global_batch_size`` of 0 is handed to OpenRLHF's
  ``training_step`` as 1. Its numerator is then a sum of (finite loss) x (mask 0) = exactly 0, so the loss
  is 0 and every gradient exactly 0 instead of 0/0; OpenRLHF's backward and ``optimizer_step`` run as
  always (DeepSpeed's accumulation boundary and the scheduler's step count are kept; the optimizer steps
  with a zero gradient: only Adam's moments and weight decay move the weights then). Both normalisers are already
  summed over the ranks by OpenRLHF, so every rank decides alike without a collective;
* **metrics of a rank with no action token**: each ``"token"`` metric is reported as 0 (its weight in
  ``ppo_train``'s sum is its 0 tokens, so a finite value changes nothing there and OpenRLHF's NaN no longer
  poisons the sum);
* **a micro-batch with no action token on any rank**: its ``"token"`` metrics come back with weight
  ``None`` (``ppo_train`` reports such a metric as it is, unreduced, and divides by nothing), as the float
  0.0. To know whether every rank's micro-batch is empty, each rank adds one ``strategy.all_reduce`` of its
  token count (``ppo_train``'s own reduction, on its group) after OpenRLHF's ``training_step``: every rank
  calls ``training_step`` for every micro-batch in the same order (``ppo_train``'s per-micro-batch
  ``all_reduce`` already relies on it), so every rank makes the same collective calls in the same order.

The end-of-update means (``status_mean``) stay OpenRLHF's token-weighted means: an entry of 0 tokens adds
0.0 x 0 to them. But ``status_mean`` takes every key's weight from the *first* micro-batch's ``weights``
(``status_list[0]["_weights"]``), the very dict ``training_step`` returned, kept by reference. Were that
first micro-batch an empty one, the ``None`` would turn every token metric of the update into a per-sample
mean. So the dicts returned with ``None`` are remembered and set back to ``"token"`` as soon as a later
micro-batch has an action token (by then ``ppo_train`` has used them for their own micro-batch and only
``status_mean`` reads them again), which is exact; an update with no action token at all keeps the ``None``,
so ``status_mean`` takes the per-sample branch (0.0 for those metrics) instead of dividing by 0 tokens. The
remembered dicts are forgotten at each epoch's first micro-batch (an epoch repeats the same rows: when the
first had no token, every epoch is empty).

Not covered: ``--train.dynamic_batch_enable`` (not in the plugin's arguments), where ``ppo_train`` passes
no normalisers and ``training_step`` reads them from the replay buffer: its metrics are handled as above,
its loss for a step with no action token is OpenRLHF's. The critic (``ppo_critic.py``, for ``gae``, which
the plugin does not map) is not patched.

Importing this module imports neither torch nor OpenRLHF.
"""

from __future__ import annotations

import functools
from typing import Any

TOKEN = "token"
NORMALISERS = ("batch_num_tokens", "global_batch_size")
_EMPTY_WEIGHTS = "_gem_empty_micro_batch_weights"  # on the trainer: the weights dicts returned with None


def make_training_step(original: Any) -> Any:
    """The patched ``ActorPPOTrainer.training_step`` around OpenRLHF's ``original`` (see the module doc)."""

    @functools.wraps(original)
    def training_step(self: Any, experience: Any, kl_ctl: float, step: int, loss_batch_info: dict | None = None) -> dict:
        status = original(self, experience, kl_ctl, step, defined_normalisers(loss_batch_info))
        return reported(self, status, step)

    return training_step


def defined_normalisers(loss_batch_info: dict | None) -> dict | None:
    """``loss_batch_info`` with a 0 normaliser (an optimizer step with no action token on any rank) as 1; the
    same object otherwise."""
    import torch

    if loss_batch_info is None:
        return None
    zero = [k for k in NORMALISERS if k in loss_batch_info and loss_batch_info[k] is not None and not bool(torch.as_tensor(loss_batch_info[k]).any())]
    if not zero:
        return loss_batch_info
    fixed = dict(loss_batch_info)  # the dict is shared by the step's micro-batches: not changed in place
    for key in zero:
        value = loss_batch_info[key]
        fixed[key] = torch.ones_like(value) if isinstance(value, torch.Tensor) else 1.0
    return fixed


def reported(trainer: Any, status: dict, step: int) -> dict:
    """``training_step``'s status as ``ppo_train`` can average it (see the module doc); one
    ``strategy.all_reduce`` on every rank."""
    import torch

    metrics, weights = status["metrics"], status["weights"]
    keys = [k for k in metrics if weights.get(k) == TOKEN]
    if status["num_action_tokens"] == 0:
        for key in keys:
            value = metrics[key]
            metrics[key] = torch.zeros_like(value) if isinstance(value, torch.Tensor) else 0.0
    total = trainer.strategy.all_reduce(float(status["num_action_tokens"]), op="sum")
    empty = trainer.__dict__.setdefault(_EMPTY_WEIGHTS, [])
    if step == 0:
        empty.clear()
    if total != 0:
        for returned, token_keys in empty:
            returned.update(dict.fromkeys(token_keys, TOKEN))
        empty.clear()
        return status
    for key in keys:
        metrics[key] = float(metrics[key])
    weights = {**weights, **dict.fromkeys(keys, None)}
    empty.append((weights, keys))
    return {**status, "weights": weights}
