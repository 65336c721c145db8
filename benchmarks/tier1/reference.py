"""The reference update of the Tier 1 check: the recorded batch through a trainer's *declared* semantics, the
maths written out (CleanRL style), and the comparison of a trainer's own update with it.

A trainer declares its semantics (:class:`Semantics`, made by ``tier1/<trainer>_update.py``'s ``semantics``
from the experiment): which estimator and options make the advantages, how the per-token loss becomes one
number, which rows a mean counts, where the old log-probs come from, the clip, the KL, the mini-batches and
epochs, and AdamW's settings and schedule. :func:`reference_update` then computes, for the recorded batch
(:mod:`tier1.batch`) and the recorded starting weights:

    A      = estimator(per-turn rewards of the healthy episodes), each turn's value on its model tokens
             (rebn: the returns G_t normalised over the batch; reinforce: G_t = r_t + gamma * G_{t+1} itself)
    old    = log pi_old(token)   (the rollout's, or the actor's at the update's start)
    ratio  = exp(log pi(token) - old)
    pg     = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
             (times min(exp(start - rollout), tis_cap) where the trainer corrects for its engine: oat's tis_c)
    kl     = k3: exp(ref - logp) - (ref - logp) - 1   (k1: logp - ref; k2: (logp - ref)^2 / 2)
    loss   = aggregate(pg + kl_coef * kl)  over the step's rows, by the declared aggregation
    AdamW step (gradient clipped to max_grad_norm by global norm), the lr of the declared schedule

for every optimizer step (``epochs`` passes of ``mini_batches`` steps, or with ``turns_per_step`` of that many turn
samples each, ROLL's; the rows of each step as the trainer chose them when it shuffles), and returns the per-token advantages and the per-parameter weight change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gem_core import algo
from gem_core.batch import sequence_batch, turn_batch
from gem_core.experiment_scripts import warmup_optimizer_steps

#: trainer -> its file here (``tier1/<module>.py``); the command runs ``run`` in the trainer's Python.
TRAINERS = {"trl": "trl_update", "openrlhf": "openrlhf_update", "oat": "oat_update", "roll": "roll_update", "rl2": "rl2_update", "verl": "verl_update"}
ADVANTAGE_EPS32 = float(np.finfo(np.float32).eps)
WEIGHT_TOLERANCE = 1e-3  # ||delta - delta_ref|| / ||delta_ref|| after the steps
FAULTS = ("lr", "kl", "clip", "aggregation", "infra")


@dataclass(frozen=True)
class Semantics:
    """What a trainer declares an update to be (see the module docstring)."""

    trainer: str
    estimator: str = "rebn"  # rebn, reinforce, grpo, drgrpo, rloo (gem_core.algo)
    gamma: float = 0.9
    eps: float = 1e-6  # ReBN's
    ddof: int = 0  # ReBN's std: 0 population, 1 sample
    advantage_dtype: str = "float64"  # what the trainer holds them in: float64 compares exactly, float32 within its rounding
    aggregation: str = "token-mean"  # token-mean, seq-mean-token-mean, seq-mean-token-sum
    token_mean_over: str = "step"  # token-mean's divisor: "step" (the step's model tokens) or "batch/steps" (the update's / mini_batches)
    seq_rows: str = "healthy"  # seq-mean's divisor: "healthy" rows of the step, or "all" rows (infra-failed ones counted)
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_aggregation: str = ""  # the KL term's own aggregation where the trainer reduces it apart (OpenRLHF: token-mean); "" = the loss's
    old_logprobs: str = "rollout"  # "rollout" (the recorded ones) or "start" (the actor's at the update's start)
    tis_cap: float = 0.0  # truncated importance sampling (oat's tis_c): pg times min(exp(start - rollout), tis_cap); 0 = off
    view: str = "sequence"  # the rows: "sequence" (a row per episode) or "turn" (a row per turn: its context, then its response)
    mini_batches: int = 1
    turns_per_step: int = 0  # with mini_batches 0 and view "turn": a step per this many turn samples, the remainder dropped (ROLL)
    epochs: int = 1
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay_bias_and_norm: bool = False  # HF Trainer: no weight decay on biases and norm weights
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    warmup: str = "hf"  # "hf": lr * k / W at step k < W; "gem": lr * (k + 1) / (W + 1)

    @property
    def steps(self) -> int:
        return self.mini_batches * self.epochs

    def step_count(self, healthy_rows: int) -> int:
        """Optimizer steps of an update of ``healthy_rows`` rows: :attr:`steps`, or with ``turns_per_step`` a step per
        that many turn samples each epoch (an update with fewer is filled up to one step)."""
        if self.turns_per_step:
            return self.epochs * max(healthy_rows // self.turns_per_step, 1)
        return self.steps

    def lr_at(self, step: int) -> float:
        if step >= self.warmup_steps:
            return self.lr
        if self.warmup == "hf":
            return self.lr * step / self.warmup_steps
        return self.lr * (step + 1) / (self.warmup_steps + 1)

    def replace(self, **changes: Any) -> Semantics:
        return dataclasses.replace(self, **changes)


def experiment_semantics(trainer: str, experiment: Any, **rules: Any) -> Semantics:
    """The update ``trainer`` declares for ``experiment``: the experiment's own values (never the plugin's mapping
    of them, which is what the check checks) and ``rules``, what the trainer decides of its own (the loss's
    divisors, which old log-probs, the advantages' dtype, its optimizer's groups and warm-up). Refuses in one line
    what the reference does not compute yet."""
    e = experiment
    if e.estimator not in ("rebn", "reinforce"):
        raise ValueError(f"tier1 for {trainer}: estimator {e.estimator} is not checked yet (rebn and reinforce are)")
    if e.turns_per_step and e.estimator != "reinforce":  # reinforce has no batch statistics for the dropped remainder to change
        raise ValueError(f"tier1 for {trainer}: turns_per_step with {e.estimator}: a remainder dropped before its batch statistics is not in the reference yet")
    if e.entropy_coef:
        raise ValueError(f"tier1 for {trainer}: entropy_coef is not in the reference yet")
    values = dict(
        trainer=trainer,
        estimator=e.estimator,  # reinforce: A_t = G_t, the per-turn discounted return (gem_core.algo.reinforce)
        gamma=e.gamma,
        eps=1e-6,
        ddof=0,
        aggregation=e.loss_aggregation,
        clip_low=e.clip_low,
        clip_high=e.clip_high,
        kl_coef=e.kl_coef,
        kl_estimator=e.kl_estimator,
        view=e.view,
        mini_batches=e.mini_batches,
        turns_per_step=e.turns_per_step,
        epochs=e.ppo_epochs,
        lr=e.lr,
        betas=tuple(e.betas),
        adam_eps=e.eps,
        weight_decay=e.weight_decay,
        max_grad_norm=e.max_grad_norm,
        warmup_steps=warmup_optimizer_steps(e),
    )
    return Semantics(**{**values, **rules})


@dataclass
class Update:
    """One side's result: per-token advantages on the completion layout (rows x response tokens, 0 on env
    tokens, padding and infra-failed rows), the weight change per parameter, and the rows of each step."""

    advantages: np.ndarray
    deltas: dict[str, np.ndarray]
    steps: list[list[int]]
    advantage_dtype: str = "float64"
    stats: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def save(self, path: str | Path) -> None:
        import torch

        torch.save(
            {"advantages": self.advantages, "deltas": self.deltas, "steps": self.steps, "advantage_dtype": self.advantage_dtype, "stats": self.stats}, path
        )

    @classmethod
    def load(cls, path: str | Path) -> Update:
        import torch

        data = torch.load(path, weights_only=False)
        return cls(
            np.asarray(data["advantages"], dtype=np.float64),
            {k: np.asarray(v, dtype=np.float64) for k, v in data["deltas"].items()},
            data["steps"],
            data["advantage_dtype"],
            data.get("stats", []),
        )


# -- the batch as rows -----------------------------------------------------------------------------------


@dataclass
class Rows:
    """One row per episode (the sequence view; or per turn, ``view="turn"``): prompt then response, right-padded;
    ``mask`` 1 on the model tokens of healthy episodes (infra-failed rows carry none)."""

    input_ids: Any  # (B, L) long
    attention: Any  # (B, L) long
    prompt_lengths: list[int]
    response_ids: np.ndarray  # (B, W)
    mask: Any  # (B, W) float, over the response positions
    rollout_logprobs: Any  # (B, W) float32
    failed: list[bool]


def rows_of(recorded: Any, pad_id: int, view: str = "sequence") -> tuple[Rows, Any]:
    """The recorded batch as :class:`Rows`, and its turn-aware batch (:func:`gem_core.batch.sequence_batch`; with
    ``view="turn"``, :func:`gem_core.batch.turn_batch`: a row per turn, its context as the prompt)."""
    import torch

    batch = (turn_batch if view == "turn" else sequence_batch)(recorded.trajectories, pad_id=pad_id)
    lengths = [len(p) + n for p, n in zip(batch.prompt_ids, batch.lengths)]
    size, width = len(batch), max(lengths)
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    for i in range(size):
        ids = list(batch.prompt_ids[i]) + batch.response_ids[i, : batch.lengths[i]].tolist()
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
    rows = Rows(
        input_ids,
        attention,
        [len(p) for p in batch.prompt_ids],
        batch.response_ids,
        torch.from_numpy(batch.loss_mask.astype(np.float32)),
        torch.from_numpy(batch.logprobs.astype(np.float32)) if batch.logprobs is not None else None,
        list(batch.infra_failed or [False] * size),
    )
    return rows, batch


def response_logprobs(model: Any, rows: Rows, index: list[int]) -> Any:
    """log pi(token | prefix) at every response position of rows ``index`` (B', W), float32."""
    import torch

    logits = model(input_ids=rows.input_ids[index], attention_mask=rows.attention[index]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, rows.input_ids[index][:, 1:, None])[..., 0]
    width = rows.response_ids.shape[1]
    out = logp.new_zeros((len(index), width))
    for k, i in enumerate(index):
        start, n = rows.prompt_lengths[i], int(rows.attention[i].sum()) - rows.prompt_lengths[i]
        out[k, :n] = logp[k, start - 1 : start - 1 + n]  # position j predicts token j + 1
    return out


# -- the advantages ---------------------------------------------------------------------------------------


def advantages(batch: Any, semantics: Semantics) -> np.ndarray:
    """Per-token advantages (float64): the estimator over the healthy episodes' per-turn rewards (gem_core.algo),
    each turn's value on its model tokens."""
    rewards, groups = batch.episode_rewards()
    s = semantics
    if s.estimator == "rebn":
        flat = algo.rebn(rewards, gamma=s.gamma, eps=s.eps, ddof=s.ddof)
    elif s.estimator == "reinforce":
        flat = algo.reinforce(rewards, gamma=s.gamma)
    elif s.estimator in ("grpo", "drgrpo"):
        flat = algo.grpo(rewards, group_by=list(groups), scale_by_std=s.estimator == "grpo")
    elif s.estimator == "rloo":
        flat = algo.rloo(rewards, group_by=list(groups))
    else:
        raise ValueError(f"unknown estimator {s.estimator!r}")
    return batch.per_token(np.asarray(flat, dtype=np.float64))


# -- the loss ---------------------------------------------------------------------------------------------


def kl_term(logp: Any, ref: Any, estimator: str) -> Any:
    import torch

    if estimator == "k1":
        return logp - ref
    if estimator == "k2":
        return 0.5 * (logp - ref) ** 2
    delta = ref - logp
    return torch.exp(delta) - delta - 1


def aggregate(per_token: Any, mask: Any, index: list[int], rows: Rows, semantics: Semantics) -> Any:
    """One number from the step's per-token loss, by the declared aggregation."""
    s = semantics
    if s.aggregation == "token-mean":
        divisor = mask.sum() if s.token_mean_over == "step" else rows.mask.sum() / s.mini_batches
        return (per_token * mask).sum() / divisor.clamp(min=1.0)
    counted = len(index) if s.seq_rows == "all" else sum(not rows.failed[i] for i in index)
    sums = (per_token * mask).sum(dim=1)
    if s.aggregation == "seq-mean-token-mean":
        sums = sums / mask.sum(dim=1).clamp(min=1.0)
    elif s.aggregation != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {s.aggregation!r}")
    return sums.sum() / max(counted, 1)


def default_steps(size: int, semantics: Semantics, failed: list[bool] | None = None) -> list[list[int]]:
    """Rows of each step without a shuffle: every pass splits the batch into ``mini_batches`` in order (with
    ``turns_per_step``: the healthy rows in order, that many a step, the remainder left out)."""
    if semantics.turns_per_step:
        healthy = [i for i in range(size) if not (failed and failed[i])]
        n = semantics.turns_per_step
        chunks = [healthy[k : k + n] for k in range(0, len(healthy) - n + 1, n)] or [healthy]
        return [chunk for _ in range(semantics.epochs) for chunk in chunks]
    parts = np.array_split(np.arange(size), semantics.mini_batches)
    return [part.tolist() for _ in range(semantics.epochs) for part in parts]


def reference_update(recorded: Any, semantics: Semantics, steps: list[list[int]] | None = None) -> Update:
    """The update of ``semantics`` on the recorded batch from the recorded weights (see the module docstring).
    ``steps``: the rows of each optimizer step (a trainer that shuffles reports its own)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tier1.batch import tokenizer

    s = semantics
    tok = tokenizer()
    rows, batch = rows_of(recorded, tok.pad_token_id, s.view)
    adv_np = advantages(batch, s)
    adv = torch.from_numpy(adv_np).float()
    steps = steps or default_steps(len(batch), s, rows.failed)
    expected = s.step_count(len(batch) - sum(rows.failed))
    if len(steps) != expected:
        raise ValueError(f"{len(steps)} steps given, the semantics make {expected}")
    if s.turns_per_step and any(len(index) != s.turns_per_step for index in steps):  # the trainer's steps, of the declared size
        raise ValueError(f"steps of {sorted({len(index) for index in steps})} rows given, the semantics take {s.turns_per_step} turn samples a step")
    model = AutoModelForCausalLM.from_pretrained(recorded.work / "actor", dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(recorded.work / "ref", dtype=torch.float32)
    model.train()  # the tiny model has no dropout; train mode as the trainers
    ref.eval()
    everyone = list(range(len(batch)))
    with torch.no_grad():
        old_all = rows.rollout_logprobs if s.old_logprobs == "rollout" else response_logprobs(model, rows, everyone)
        ref_all = response_logprobs(ref, rows, everyone)
        tis_all = None  # truncated importance sampling: the actor's at the start over the rollout's, capped
        if s.tis_cap:
            start_all = old_all if s.old_logprobs == "start" else response_logprobs(model, rows, everyone)
            tis_all = torch.exp(start_all - rows.rollout_logprobs).clamp(max=s.tis_cap)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if s.no_decay_bias_and_norm and (name.endswith("bias") or "norm" in name) else decay).append(p)
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=s.lr, betas=s.betas, eps=s.adam_eps)
    stats = []
    for k, index in enumerate(steps):
        for group in optimizer.param_groups:
            group["lr"] = s.lr_at(k)
        logp = response_logprobs(model, rows, index)
        mask, a, old, ref_lp = rows.mask[index], adv[index], old_all[index], ref_all[index]
        ratio = torch.exp(logp - old)
        pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - s.clip_low, 1 + s.clip_high) * a)
        if tis_all is not None:
            pg = pg * tis_all[index]
        if s.kl_coef and s.kl_aggregation:  # pg and KL reduced apart: aggregate(pg) + kl_coef * aggregate'(kl)
            kl_loss = aggregate(kl_term(logp, ref_lp, s.kl_estimator), mask, index, rows, s.replace(aggregation=s.kl_aggregation))
            loss = aggregate(pg, mask, index, rows, s) + s.kl_coef * kl_loss
        else:
            per_token = pg + s.kl_coef * kl_term(logp, ref_lp, s.kl_estimator) if s.kl_coef else pg
            loss = aggregate(per_token, mask, index, rows, s)
        optimizer.zero_grad()
        loss.backward()
        if s.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            clipped = (((ratio - 1 < -s.clip_low) | (ratio - 1 > s.clip_high)).float() * mask).sum() / mask.sum().clamp(min=1)
        stats.append({"loss": float(loss.detach()), "clip_fraction": float(clipped)})
    deltas = {name: (p.detach() - start[name]).double().numpy() for name, p in model.named_parameters()}
    return Update(adv_np, deltas, [list(map(int, i)) for i in steps], "float64", stats)


# -- the comparison ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    advantage_difference: float  # largest |A - A_ref| over every token of the completion layout
    advantage_tolerance: float
    weight_difference: float  # ||delta - delta_ref|| / ||delta_ref|| over every weight
    weight_change: float  # ||delta_ref||

    @property
    def ok(self) -> bool:
        return self.advantage_difference <= self.advantage_tolerance and self.weight_difference <= WEIGHT_TOLERANCE


def compare(trainer: Update, reference: Update) -> Comparison:
    """The largest advantage difference (tolerance: 0 where the trainer holds them in float64, one float32 ulp
    of the largest advantage otherwise) and the weight change's difference relative to the reference's. A row whose
    advantages are all NaN is one the trainer dropped before computing them (ROLL's remainder of ``turns_per_step``):
    not compared, and in none of the trainer's steps."""
    a, b = trainer.advantages, reference.advantages
    dropped = np.isnan(a).all(axis=1) if a.size else np.zeros(a.shape[0], dtype=bool)
    if any(dropped[i] for index in trainer.steps for i in index if i < dropped.size):
        raise ValueError("a row in the trainer's steps has no advantages")
    width = max(a.shape[1], b.shape[1])
    a = np.pad(a, ((0, 0), (0, width - a.shape[1])))
    b = np.pad(b, ((0, 0), (0, width - b.shape[1])))
    if a.shape != b.shape:
        raise ValueError(f"advantages of {a.shape[0]} rows against the reference's {b.shape[0]}")
    scale = float(np.abs(b).max()) if b.size else 0.0
    tolerance = 0.0 if trainer.advantage_dtype == "float64" else ADVANTAGE_EPS32 * max(scale, 1.0)
    if set(trainer.deltas) != set(reference.deltas):
        raise ValueError(f"parameters differ: {sorted(set(trainer.deltas) ^ set(reference.deltas))[:5]}")
    diff = np.sqrt(sum(float(((trainer.deltas[n] - reference.deltas[n]) ** 2).sum()) for n in reference.deltas))
    norm = np.sqrt(sum(float((d**2).sum()) for d in reference.deltas.values()))
    kept = ~dropped
    difference = float(np.abs(a - b)[kept].max()) if kept.any() else float("inf")
    return Comparison(difference, tolerance, float(diff / max(norm, 1e-30)), float(norm))
