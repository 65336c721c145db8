"""A micro-batch with no action token in OpenRLHF 0.11.2's own ``ActorPPOTrainer.ppo_train`` (issue 64), and the
plugin's patch of ``training_step`` (``gem_integrations.openrlhf.training_step``).

The GEM agent file gives an infra-failed episode a row with no action token; at ``--train.micro_batch_size 1``
(OpenRLHF's default) that row is a micro-batch of its own. What runs is OpenRLHF's: the plugin's arguments for
``examples/experiments/portable.toml`` (a KL loss on) parsed by the launcher's parser, the replay buffer, ``ppo_train``
(its shuffled ``DataLoader``, epochs, ``iter_grad_accum_global_norm``, metric averaging), ``training_step``
(``openrlhf.models.Actor`` over a tiny Qwen2 model, ``PolicyLoss``, ``compute_approx_kl``, ``aggregate_loss``,
the entropy term). Stand-ins: DeepSpeed's engine (the Tier 1 check's CPU strategy,
``benchmarks/tier1/openrlhf_update.py``: torch AdamW over float32 masters, DeepSpeed's 1/gas scaling and clipping;
with two ranks, DeepSpeed's gradient averaging over them added), ``torch.distributed`` a gloo group, CUDA's device
calls answered for the CPU; the rows are made here (tokens, advantages and reference log-probs drawn; the old
log-probs are the actor's own at the start, as ``make_experience`` computes them).

"Unpatched" is the plugin uninstalled (OpenRLHF's own ``training_step``). Its weights, for the comparison, come from
an unpatched run whose ``strategy.all_reduce`` answers 1 instead of 0 for ``ppo_train``'s reduced token count
(:func:`defined_denominator`): that changes nothing but the metric division that would stop it, so its weights are
OpenRLHF's training maths unchanged.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for _path in (str(HERE), str(ROOT / "benchmarks")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import openrlhf_import_stubs  # noqa: E402

openrlhf_import_stubs.install()

VOCAB = 64
PROMPT = 4  # prompt tokens of every row
KL = 0.05  # the KL coefficient (--algo.kl.use_loss) and ppo_train's kl_ctl
LR = 1e-3
HEALTHY = "healthy"
FAILED = "failed"


def parsed_args(work: Path, *, batch_size: int, epochs: int, loss_agg_mode: str) -> Any:
    """The plugin's arguments (portable.toml, a KL loss, lr 1e-3) at OpenRLHF's default micro-batch size, 1,
    through the launcher's parser; then the scenario's ``--train.batch_size``, epochs and loss aggregation."""
    from tier1 import openrlhf_update

    from gem_core.experiment import load_experiment

    experiment = dataclasses.replace(load_experiment(ROOT / "examples" / "experiments" / "portable.toml"), kl_coef=KL, lr=LR)
    args = openrlhf_update.parsed_arguments(experiment, work)
    assert args.train.micro_batch_size == 1 and args.algo.kl.use_loss and args.actor.policy_loss_type == "ppo"
    assert args.actor.entropy_coef is not None and args.train.dynamic_batch_enable is False
    args.train.batch_size, args.train.max_epochs, args.actor.loss_agg_mode = batch_size, epochs, loss_agg_mode
    return args


def strategy_class(world_size: int) -> type:
    """The Tier 1 check's CPU strategy; with several ranks, ``world_size`` from the group, OpenRLHF's own
    ``all_reduce`` and DeepSpeed's gradient averaging over the ranks at each optimizer step."""
    import torch.distributed as dist
    from openrlhf.utils.deepspeed import DeepspeedStrategy
    from tier1 import openrlhf_update

    base = openrlhf_update._cpu_strategy_class()
    if world_size == 1:
        return base

    class RanksStrategy(base):
        def setup_distributed(self, timeout: Any = None) -> None:
            super().setup_distributed(timeout)
            self.world_size = dist.get_world_size()
            self.accumulated_gradient = self.train_batch_size // self.micro_train_batch_size // self.world_size

        all_reduce = DeepspeedStrategy.all_reduce  # OpenRLHF's (the CPU strategy's is one process's)

        def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str = "model", **kwargs: Any) -> None:
            if (self.micro_steps + 1) % self.accumulated_gradient == 0:  # DeepSpeed averages gradients over the ranks
                for param in model.parameters():
                    if param.grad is None:
                        param.grad = torch.zeros_like(param)
                    dist.all_reduce(param.grad)
                    param.grad /= self.world_size
            super().optimizer_step(optimizer, model, scheduler, name, **kwargs)

    return RanksStrategy


def rows_of(kinds: list[str], seed: int) -> list[dict]:
    """One row per kind: a prompt and a response of its own length, drawn from ``seed``; a failed row has no
    action token (what the GEM agent file gives an infra-failed episode), advantage 0."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i, kind in enumerate(kinds):
        response = 3 + (i * 5 + seed) % 6  # healthy rows of different lengths: token and row weights differ
        sequence = torch.randint(1, VOCAB, (1, PROMPT + response), generator=generator)
        mask = torch.zeros(1, PROMPT + response - 1, dtype=torch.bool)
        if kind == HEALTHY:
            mask[:, PROMPT - 1 :] = True
        advantages = torch.randn(mask.shape, generator=generator) * mask
        reference_shift = 0.1 * torch.randn(mask.shape, generator=generator)
        rows.append({"sequences": sequence, "action_mask": mask, "advantages": advantages, "reference_shift": reference_shift, "failed": kind == FAILED})
    return rows


def make_trainer(args: Any, rows: list[dict]) -> tuple[Any, Any, Any]:
    """OpenRLHF's ``ActorPPOTrainer`` over a fresh tiny actor (the same weights every time), ``rows`` in its
    replay buffer; returns (trainer, strategy, actor)."""
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.utils import get_strategy
    from tier1 import openrlhf_update

    from gem_core.testing import build_tiny_model

    import torch.distributed as dist

    strategy = strategy_class(dist.get_world_size())(**openrlhf_update._strategy_kwargs(get_strategy(args)))
    strategy.setup_distributed()
    model = build_tiny_model(VOCAB, seed=7)
    model.config.use_cache = False
    actor = Actor(model, temperature=args.rollout.temperature)
    actor.packing_samples = args.ds.packing_samples  # what Actor sets when it loads a checkpoint by path
    trainer, actor = openrlhf_update.actor_trainer(strategy, actor, args, scheduler_steps=100)
    for i, row in enumerate(rows):
        sequences, mask = row["sequences"], row["action_mask"]
        attention = torch.ones_like(sequences)
        with torch.no_grad():  # the old log-probs: the actor's at the update's start, as make_experience computes them
            old = actor(sequences, mask, attention_mask=attention)
        experience = Experience(
            sequences=sequences,
            attention_mask=attention,
            action_mask=mask,
            action_log_probs=old,
            base_action_log_probs=(old + row["reference_shift"]) * mask,
            advantages=row["advantages"],
            returns=row["advantages"].clone(),
            response_length=mask.sum(-1).float(),
            total_length=attention.sum(-1).float(),
            index=[i],
            info={"gem_infra_failed": torch.tensor([float(row["failed"])])},
        )
        trainer.replay_buffer.append(experience)
    return trainer, strategy, actor


def spy(trainer: Any, strategy: Any) -> list[dict]:
    """Record what each ``training_step`` (the class's, patched or not) returned to ``ppo_train``."""
    seen: list[dict] = []
    real = trainer.training_step

    def training_step(experience: Any, kl_ctl: float, step: int, loss_batch_info: Any = None) -> Any:
        status = real(experience, kl_ctl, step, loss_batch_info)
        metrics = {k: float(v.float().mean()) if isinstance(v, torch.Tensor) else float(v) for k, v in status["metrics"].items()}
        seen.append(
            {
                "tokens": status["num_action_tokens"],
                "metrics": metrics,
                "weights": dict(status["weights"]),
                "steps_done": len(strategy.grad_norms),
            }
        )
        return status

    trainer.training_step = training_step
    return seen


def defined_denominator(strategy: Any) -> None:
    """For the unpatched reference only: ``ppo_train``'s reduced token count answered 1 where it is 0, so that its
    metric division does not stop it (nothing else reads it: the weights are OpenRLHF's)."""
    real = strategy.all_reduce

    def all_reduce(data: Any, op: str = "mean") -> Any:
        out = real(data, op)
        if isinstance(out, dict) and out.get("_num_action_tokens") == 0:
            out["_num_action_tokens"] = 1.0
        return out

    strategy.all_reduce = all_reduce


def train(args: Any, rows: list[dict], *, patched: bool, seed: int, reference: bool = False) -> dict:
    """One ``ppo_train`` (the DataLoader's shuffle drawn from ``seed``); patched or not, the plugin put back as it
    was. Returns its status, what each training_step returned, the grad norms and the final weights."""
    from gem_integrations.openrlhf import advantage

    was = advantage.is_active()
    (advantage.install if patched else advantage.uninstall)()
    try:
        trainer, strategy, actor = make_trainer(args, rows)
        seen = spy(trainer, strategy)
        if reference:
            defined_denominator(strategy)
        torch.manual_seed(seed)
        status = trainer.ppo_train(KL)
        weights = {name: p.detach().clone() for name, p in actor.model.named_parameters()}
        return {"status": status, "seen": seen, "grad_norms": list(strategy.grad_norms), "weights": weights}
    finally:
        (advantage.install if was else advantage.uninstall)()


def shuffled_order(n: int, seed: int) -> list[int]:
    """The replay-buffer order of ``ppo_train``'s first epoch from ``seed`` (its DataLoader: shuffled, batches of 1;
    the test checks it against what training_step saw)."""
    from torch.utils.data import DataLoader

    torch.manual_seed(seed)
    return [int(i) for batch in DataLoader(range(n), batch_size=1, shuffle=True, drop_last=True) for i in batch]


def seed_with(kinds: list[str], first_failed: bool) -> int:
    """A seed whose first micro-batch is (or is not) a failed row."""
    return next(s for s in range(1000) if (kinds[shuffled_order(len(kinds), s)[0]] == FAILED) == first_failed)


def finite(status: dict) -> bool:
    return all(math.isfinite(float(v)) for v in status.values())


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def group():
    """A one-process gloo group, CUDA's device calls answered for the CPU (the Tier 1 check's)."""
    from tier1.cpu import one_process_group

    with one_process_group():
        yield


def initial_weights() -> dict:
    from gem_core.testing import build_tiny_model

    return {name: p.detach() for name, p in build_tiny_model(VOCAB, seed=7).named_parameters()}


KINDS = [HEALTHY, HEALTHY, FAILED, HEALTHY]  # one optimizer step of 4 micro-batches of 1 (gas 4), two epochs
TOKEN_METRICS = {"policy_loss", "ppo_kl", "ppo_clip_ratio", "kl", "logprobs_diff", "entropy_loss"}


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("first_failed", [True, False], ids=["failed-row-first", "failed-row-later"])
def test_a_micro_batch_of_a_failed_row_alone(group, tmp_path, loss_agg_mode, first_failed):
    """Micro-batch size 1, a failed row among healthy ones: OpenRLHF's ppo_train stops (ZeroDivisionError); patched,
    it completes with finite metrics, the same weights as OpenRLHF's training maths, and OpenRLHF's token-weighted
    means of the update (also when the failed row is the first micro-batch, whose weights ppo_train's final
    averaging reads for every micro-batch)."""
    args = parsed_args(tmp_path, batch_size=len(KINDS), epochs=2, loss_agg_mode=loss_agg_mode)
    rows = rows_of(KINDS, seed=1)
    seed = seed_with(KINDS, first_failed)

    with pytest.raises(ZeroDivisionError):
        train(args, rows, patched=False, seed=seed)
    reference = train(args, rows, patched=False, seed=seed, reference=True)
    patched = train(args, rows, patched=True, seed=seed)

    seen = patched["seen"]
    assert [s["tokens"] == 0 for s in seen[: len(KINDS)]] == [KINDS[i] == FAILED for i in shuffled_order(len(KINDS), seed)]
    assert (seen[0]["tokens"] == 0) is first_failed
    assert len(seen) == 2 * len(KINDS) and len(patched["grad_norms"]) == 2  # gas 4, two epochs
    # the weights: OpenRLHF's training maths unchanged (and moved)
    assert same_weights(patched["weights"], reference["weights"]) and patched["grad_norms"] == reference["grad_norms"]
    assert not same_weights(patched["weights"], initial_weights())
    # OpenRLHF's own metrics of the failed row's micro-batch: a mean over no token is NaN (masked_mean's 0/0)
    assert any(math.isnan(s["metrics"]["ppo_kl"]) for s in reference["seen"] if s["tokens"] == 0)
    # patched: finite, the failed row's token metrics reported as 0.0 with no weight, and the update's means
    # OpenRLHF's token-weighted ones over the micro-batches
    status = patched["status"]
    assert finite(status), status
    token_keys = sorted(k for k, w in next(s for s in seen if s["tokens"])["weights"].items() if w == "token")
    assert TOKEN_METRICS <= set(token_keys)
    empty = [s for s in seen if s["tokens"] == 0]
    assert len(empty) == 2 and all(s["weights"][k] is None and s["metrics"][k] == 0.0 for s in empty for k in token_keys)
    for key in token_keys:
        expected = sum(s["metrics"][key] * s["tokens"] for s in seen) / sum(s["tokens"] for s in seen)
        assert status[key] == pytest.approx(expected, rel=1e-6, abs=1e-12), key
    per_row = sum(s["metrics"]["policy_loss"] for s in seen) / len(seen)  # what a per-row mean would log instead
    assert status["policy_loss"] != pytest.approx(per_row, rel=1e-3)


def seed_at(kinds: list[str], position: int) -> int:
    """A seed whose first epoch has the (first) failed row at ``position``."""
    return next(s for s in range(1000) if kinds[shuffled_order(len(kinds), s)[position]] == FAILED)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_an_optimizer_step_with_no_action_token(group, tmp_path, loss_agg_mode):
    """``--train.batch_size`` 1 at micro-batch 1 (gas 1): the failed row is an optimizer step of its own, whose
    normalisers (its action tokens, its rows with one) are 0. OpenRLHF's loss is then 0/0: NaN, a NaN gradient and
    NaN weights from that step on. Patched, the loss is 0 with an exactly zero gradient (the step before it is
    OpenRLHF's own, the one after it finite)."""
    kinds = [HEALTHY, FAILED, HEALTHY]
    args = parsed_args(tmp_path, batch_size=1, epochs=1, loss_agg_mode=loss_agg_mode)
    rows = rows_of(kinds, seed=2)
    seed = seed_at(kinds, 1)  # a healthy step before it and one after

    reference = train(args, rows, patched=False, seed=seed, reference=True)
    patched = train(args, rows, patched=True, seed=seed)

    assert [s["tokens"] == 0 for s in patched["seen"]] == [False, True, False]
    assert [s["steps_done"] for s in patched["seen"]] == [1, 2, 3]  # a step after each micro-batch
    assert math.isnan(reference["seen"][1]["metrics"]["policy_loss"]) and math.isnan(reference["grad_norms"][1])
    assert not all(bool(torch.isfinite(w).all()) for w in reference["weights"].values())
    assert patched["grad_norms"][0] == reference["grad_norms"][0]  # the step before: OpenRLHF's
    assert patched["grad_norms"][1] == 0.0 and math.isfinite(patched["grad_norms"][2]) and patched["grad_norms"][2] > 0
    assert all(bool(torch.isfinite(w).all()) for w in patched["weights"].values())
    assert finite(patched["status"]), patched["status"]


# -- several ranks ---------------------------------------------------------------------------------------------------

#: Each rank's rows (the same shuffle on both: the seed is shared). Buffer position 1 is a failed row on every rank
#: (the micro-batch has no action token anywhere: the division by zero); position 2 on rank 0 only (OpenRLHF's NaN
#: mean over no token times 0 tokens poisons the metric's sum over the ranks).
RANK_KINDS = ([HEALTHY, FAILED, FAILED, HEALTHY], [HEALTHY, FAILED, HEALTHY, HEALTHY])
RANKS_SEED = 3


def rank_main(rank: int, world_size: int, port: int, out: str) -> None:
    """One rank of :func:`test_several_ranks` (run in its own process): the three runs, saved to ``out``."""
    from datetime import timedelta

    import torch.distributed as dist
    from tier1.cpu import one_process_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=600))
    try:
        with one_process_group():  # the group above is kept; CUDA's device calls answered for the CPU
            args = parsed_args(Path(out).parent, batch_size=world_size * len(RANK_KINDS[rank]), epochs=2, loss_agg_mode="token-mean")
            rows = rows_of(RANK_KINDS[rank], seed=10 + rank)
            try:
                train(args, rows, patched=False, seed=RANKS_SEED)
                unpatched = "completed"
            except ZeroDivisionError:
                unpatched = "ZeroDivisionError"
            reference = train(args, rows, patched=False, seed=RANKS_SEED, reference=True)
            patched = train(args, rows, patched=True, seed=RANKS_SEED)
        torch.save({"unpatched": unpatched, "reference": reference, "patched": patched}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_several_ranks(tmp_path):
    """Two ranks (gloo, each in its own process), micro-batch 1: OpenRLHF's ppo_train stops on both where a
    micro-batch has no action token on any rank, and logs NaN where one rank's has none. Patched, both ranks make
    the same collective calls in the same order (they complete), log the same finite metrics, and end with the
    weights of OpenRLHF's training maths (the same on both ranks, DeepSpeed's gradient averaging)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    module = Path(__file__).stem
    processes = []
    for rank in range(2):
        code = f"import sys; sys.path[:0] = {[str(HERE), str(ROOT / 'benchmarks')]!r}; import {module}; {module}.rank_main({rank}, 2, {port}, {str(tmp_path / f'rank{rank}.pt')!r})"
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=1700)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert [p.returncode for p in processes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]

    for rank, result in enumerate(ranks):
        seen = result["patched"]["seen"]
        assert [s["tokens"] == 0 for s in seen[:4]] == [RANK_KINDS[rank][i] == FAILED for i in shuffled_order(4, RANKS_SEED)]
        assert result["unpatched"] == "ZeroDivisionError"
        assert math.isnan(result["reference"]["status"]["ppo_kl"])  # rank 0's NaN in the sum over the ranks
        assert finite(result["patched"]["status"]), result["patched"]["status"]
        assert same_weights(result["patched"]["weights"], result["reference"]["weights"])
        assert result["patched"]["grad_norms"] == result["reference"]["grad_norms"] and len(result["patched"]["grad_norms"]) == 2
        # per epoch: the micro-batch empty on every rank reported with no weight, rank 0's other empty one weighted
        empty = [s["tokens"] == 0 for s in seen]
        unweighted = [all(s["weights"][k] is None for k in TOKEN_METRICS) for s in seen]
        assert sum(empty) == (4 if rank == 0 else 2) and sum(unweighted) == 2 and all(e for e, u in zip(empty, unweighted) if u)
    assert [s["weights"]["policy_loss"] for s in ranks[0]["patched"]["seen"]] == [s["weights"]["policy_loss"] for s in ranks[1]["patched"]["seen"]]
    assert ranks[0]["patched"]["status"] == ranks[1]["patched"]["status"]
    assert same_weights(ranks[0]["patched"]["weights"], ranks[1]["patched"]["weights"])
    assert not same_weights(ranks[0]["patched"]["weights"], initial_weights())
