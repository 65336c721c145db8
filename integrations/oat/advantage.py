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

**One optimizer step per pass** (issue 64). oat hands ``--train-batch-size`` to DeepSpeed as its global batch,
so DeepSpeed accumulates ``train_batch_size / (train_batch_size_per_device x devices)`` micro-batches before it
steps, while oat's multi-turn ``learning_step`` calls ``strategy.backward`` and ``strategy.optimizer_step``
(DeepSpeed's ``engine.backward``, which divides the loss by that count, and ``engine.step``, which steps at the
count's boundary only) once per micro-batch, ``--num-ppo-epochs`` passes over the learner's turn rows. An update's
turn count varies; the plugin's ``--train-batch-size`` is every turn an update can hold (so that oat never
subsamples), more than an update has: no weight moved and ``learning_step`` failed on its metrics of the steps
made (``torch.tensor([]).max()``), and with more rows the steps would fall across passes and updates.
:class:`GemLearner` sets, before each ``learning_step``, the engine's accumulation to that step's micro-batches
(DeepSpeed 0.16.8's ``DeepSpeedEngine.set_train_batch_size``: the new global batch must divide by micro-batch x
devices; it only rewrites ``train_batch_size`` and ``gradient_accumulation_steps`` in the engine's config) and
oat's ``strategy.grad_acc_step`` (where oat reads the count: its gradient-norm metric and ``policy_sgd_step``).
DeepSpeed places a boundary where ``(engine.micro_steps + 1) % gradient_accumulation_steps == 0``, its micro-step
counter running since the engine was built (the counter's one use in 0.16.8's engine); the learner checks that the
last accumulation closed (the counter a multiple of its count: each step of this learner ends on a boundary) and
starts the counter again at 0, so that the boundaries fall on this step's passes. Each pass is then one optimizer
step, each micro-batch's loss divided by the pass's micro-batches: the step's gradient is the mean over its rows
(oat's rows are turns, each the mean of its tokens' loss).

**Several devices.** Each device's learner holds its own turns, and DeepSpeed's devices must run the same number
of micro-batches between boundaries (ZeRO-2 reduces the gradients in every micro-batch's backward, and the step
all-reduces the norm: a device that runs fewer leaves the others waiting). So the devices agree on the largest row
count (an all-reduced max, and the all-reduced sum of rows), and each one pads its batch up to it with copies of
its shortest row whose loss mask and advantage are 0 (no gradient: oat multiplies each row's loss by its loss
mask), so that every device runs that many micro-batches a pass (:func:`accumulation`, :func:`padded`). DeepSpeed
divides each micro-batch's loss by the accumulation and averages the gradient over devices, so the real rows'
loss masks are multiplied by ``devices x padded rows / all rows``: the step's gradient is the mean over every
device's rows (the factor is exactly 1 on one device, or when every device has the same rows, the padding then
none). The cost is the padding's forward passes; oat's batch metrics (``adv_mean``, the last micro-batch's
``pg_loss``, its KL estimates) count the pad rows and the factor, and oat's ``policy_sgd_step`` (its own rows x
passes / the accumulation) counts fewer steps than a padded device takes. Another scheme, each device stepping
after its own rows, would need the devices' micro-batch counts to agree anyway (the hang above). Not checked:
ZeRO's CPU-offload path (``--adam-offload``), whose optimizer keeps the accumulation it was built with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner
from oat.model import LLM

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


@dataclass(frozen=True)
class Accumulation:
    """One learning step's accumulation on one device (:func:`accumulation`)."""

    micro_batches: int  #: micro-batches every device runs a pass: DeepSpeed's gradient_accumulation_steps
    rows: int  #: rows every device trains a pass, its own then padding (micro_batches x micro-batch size)
    pad: int  #: rows this device adds (loss mask 0)
    weight: float  #: the factor on this device's own rows' loss masks
    train_batch_size: int  #: the engine's global batch (``set_train_batch_size``): rows x devices


def accumulation(local_rows: int, max_rows: int, total_rows: int, world_size: int, micro_batch_size: int = 1) -> Accumulation:
    """The accumulation of a learning step that makes each pass one optimizer step whose gradient is the mean over
    every device's rows: this device holds ``local_rows``, the devices ``max_rows`` at most and ``total_rows`` in
    all. Every device pads to the largest count, rounded up to whole micro-batches; DeepSpeed divides each
    micro-batch's loss (a mean over its rows) by the micro-batches and averages over the devices, hence the
    weight ``world_size x rows / total_rows`` on the real rows (see the module docstring)."""
    if world_size < 1 or micro_batch_size < 1:
        raise ValueError(f"world_size and micro_batch_size must be positive, got {world_size} and {micro_batch_size}")
    if not 0 < local_rows <= max_rows <= total_rows <= max_rows * world_size:
        raise ValueError(f"inconsistent row counts: {local_rows} here, {max_rows} at most and {total_rows} in all over {world_size} devices")
    micro_batches = -(-max_rows // micro_batch_size)
    rows = micro_batches * micro_batch_size
    return Accumulation(micro_batches, rows, rows - local_rows, world_size * rows / total_rows, rows * world_size)


def padded(trajectory: dict[str, Any], plan: Accumulation) -> dict[str, Any]:
    """oat's collated batch of one device (``MultiTurnTransitionDataset.collate_fn``: one value or tensor row per
    turn row, every field) with ``plan.pad`` rows added, copies of its shortest row with loss mask 0 and advantage
    0, and its own rows' loss masks times ``plan.weight``. The batch itself when there is nothing to change."""
    if plan.pad == 0 and plan.weight == 1.0:
        return trajectory
    n = len(trajectory["input_ids"])
    filler = int(torch.argmin(trajectory["attention_mask"].sum(1)))  # the cheapest forward pass
    index = list(range(n)) + [filler] * plan.pad
    out: dict[str, Any] = {}
    for key, value in trajectory.items():
        if isinstance(value, torch.Tensor) and len(value) == n:
            out[key] = value[index]
        elif isinstance(value, (list, tuple)) and len(value) == n:
            out[key] = [value[i] for i in index]
        else:
            raise TypeError(f"oat's batch field {key!r} does not hold one value per row")
    out["loss_masks"] = [float(mask) * plan.weight for mask in trajectory["loss_masks"]] + [0.0] * plan.pad
    out["advantages"] = [*trajectory["advantages"], *[np.float32(0.0)] * plan.pad]
    return out


def deepspeed_engine(model: Any) -> Any:
    """DeepSpeed's engine of oat's policy: oat's ``DeepspeedStrategy.prepare`` puts it in ``LLM.model`` (or returns
    it, for a bare module)."""
    engine = model.model if isinstance(model, LLM) else model
    if not hasattr(engine, "set_train_batch_size"):
        raise TypeError(f"the learner's model is not DeepSpeed-prepared (no engine with set_train_batch_size): {type(engine).__name__}")
    return engine


class GemLearner(PPOMultiTurnLearner):
    """oat's multi-turn learner; with ``args.gem_rebn_before_subsampling`` the advantages are ReBN over
    every transition of this step on all devices (:func:`gem_core.algo.rebn`, ``distributed=True``,
    ddof 0, eps 1e-9) before oat subsamples, and ``learning_step`` does not whiten again. Otherwise it
    is oat's learner, with oat's ``--whiten-adv`` done by :func:`whiten` (no NaN on a constant batch).
    Each ``learning_step`` takes one optimizer step per pass (``--num-ppo-epochs``), the gradient the mean over
    the step's turn rows on every device, whatever ``--train-batch-size`` says (see the module docstring)."""

    def prepare_data(self, strategy: Any, tokenizer: Any) -> None:
        """oat's step loop sized from the GEM rows (:func:`~gem_integrations.oat.dataset.prepare_learner_data`),
        not from oat's ``--prompt-data`` (by default a TL;DR set downloaded from the hub, which the GEM actor
        never reads)."""
        prepare_learner_data(self, strategy)

    def learning_step(self, trajectory: Any) -> Any:
        if getattr(self, "critic", None) is not None:
            raise ValueError("GemLearner trains a policy without a critic (ReBN: rebn_args); its padding rows would train oat's critic")
        whitening = self.args.whiten_adv
        if whitening:
            trajectory = {**trajectory, "advantages": list(whiten(trajectory["advantages"], distributed=_distributed()))}
        trajectory = padded(trajectory, self.set_accumulation(len(trajectory["input_ids"])))
        if not whitening:
            return super().learning_step(trajectory)
        self.args.whiten_adv = False  # oat's own whitening would divide by its NaN std: done above
        try:
            return super().learning_step(trajectory)
        finally:
            self.args.whiten_adv = True

    def set_accumulation(self, rows: int) -> Accumulation:
        """The engine's and oat's accumulation for a learning step over this device's ``rows``: every device's
        counts (all-reduced), :func:`accumulation`, then DeepSpeed's ``set_train_batch_size``, its micro-step
        counter at a boundary, and oat's ``strategy.grad_acc_step`` (see the module docstring)."""
        world = self.strategy.world_size
        if _distributed():
            most = round(self.strategy.all_reduce(float(rows), op="max"))
            total = round(self.strategy.all_reduce(float(rows), op="sum"))
        elif world == 1:
            most = total = rows
        else:
            raise RuntimeError(f"{world} devices but no process group to agree on their rows")
        plan = accumulation(rows, most, total, world, self.args.train_batch_size_per_device)
        engine = deepspeed_engine(self.model)
        if engine.micro_steps % engine.gradient_accumulation_steps():
            raise RuntimeError(
                f"DeepSpeed's engine is inside an accumulation ({engine.micro_steps} micro-steps, {engine.gradient_accumulation_steps()} a step): "
                "its gradients would enter this step"
            )
        engine.set_train_batch_size(plan.train_batch_size)
        engine.micro_steps = 0  # the next boundary after this step's first pass
        self.strategy.grad_acc_step = plan.micro_batches
        return plan

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
