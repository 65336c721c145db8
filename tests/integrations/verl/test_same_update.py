"""Tier 1 for verl (issue 64): the recorded batch and weights through verl 0.9.1's own v1 trainer step (the plugin's
episodes put into TransferQueue by verl's agent-loop postprocess, ``_compute_old_log_prob``, ``_compute_ref_log_prob``,
``_compute_advantage`` as the plugin patches it, ``_update_actor`` on verl's ``ActorRolloutRefWorker`` and FSDP engine:
``ppo_loss``, AdamW, clipping, scheduler; Ray and TransferQueue's actors replaced by in-process stand-ins, see
``benchmarks/tier1/verl_update.py``) equal the reference update under verl's declared semantics, and the check fails on
each injected fault.

The batch (8 episodes of portable.toml's GuessTheNumber, groups of 2, one flagged as failed by the infrastructure) and
the check's settings (a KL term, two optimizer steps, lr 1e-3 so that ratios leave the clip) are those of
``python benchmarks/same_update.py --trainers verl --episodes 8``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402
from helpers import tier1 as tier1_helpers  # noqa: E402
from tier1 import verl_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import ADVANTAGE_EPS32, FAULTS, WEIGHT_TOLERANCE, Update, compare, reference_update  # noqa: E402

EPISODES = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matrices gain nothing from threads, which on a busy machine spin (CPU time, not results)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tier1_helpers.prepared(tmp_path_factory, "tier1-verl")


@pytest.fixture(scope="module")
def fault_free(work):
    """The command's trainer side (``--run verl``, in this process): verl's update of the batch, as saved."""
    assert same_update.main(["--run", "verl", "--out", str(work)]) == 0
    return Update.load(work / "verl.pt")


experiment_of = tier1_helpers.experiment_of


def test_the_batch_is_sensitive(work):
    """Different lengths, turns of both signs, one failed episode, old log-probs and the reference model both away
    from the actor."""
    tier1_helpers.assert_batch_is_sensitive(work, verl_update.semantics(experiment_of(work)))


def test_the_mapping_is_what_verl_runs(work):
    """The check's verl config is the plugin's overrides composed by hydra (plus the CPU's devices and FSDP2): the
    values the update reads are the experiment's."""
    e = experiment_of(work)
    config = verl_update.composed_config(e, work)
    actor = config.actor_rollout_ref.actor
    assert config.algorithm.adv_estimator == "rebn" and config.algorithm.use_kl_in_reward is False and config.trainer.use_v1
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (True, e.kl_coef, "low_var_kl")
    assert (actor.loss_agg_mode, actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == ("token-mean", e.clip_low, e.clip_high, 1e9)
    assert (actor.optim.lr, actor.optim.weight_decay, actor.optim.clip_grad, actor.optim.lr_warmup_steps) == (e.lr, e.weight_decay, e.max_grad_norm, 0)
    assert actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n == EPISODES and actor.ppo_epochs == 2 and actor.shuffle is False
    assert (actor.strategy, config.actor_rollout_ref.ref.strategy) == ("fsdp2", "fsdp2")  # CPU_OVERRIDES: FSDP1 needs a GPU


def test_verl_update_equals_the_reference(work, fault_free):
    """Advantages within float32 rounding, the weight change after two steps within 1e-3 of the reference's, with the
    KL on and the clip acting; the plugin's advantage step took the turn ids from TransferQueue and left the failed
    episode out."""
    theirs = fault_free
    experiment = experiment_of(work)
    ours = reference_update(load(work), verl_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * np.abs(ours.advantages).max())
    assert result.advantage_difference <= result.advantage_tolerance, result
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    assert experiment.kl_coef > 0 and len(theirs.steps) == 2 and max(s["clip_fraction"] for s in ours.stats) > 0.02
    assert [sorted(step) for step in theirs.steps] == [list(range(EPISODES))] * 2  # every row once per epoch
    assert not theirs.advantages[INFRA_EPISODE].any()
    assert theirs.stats[0]["gem/turn_ids_from_mask"] == 0 and theirs.stats[0]["gem/infra_failed_episodes"] == 1
    assert [s["loss"] for s in theirs.stats] == pytest.approx([s["loss"] for s in ours.stats], rel=1e-4)
    table = same_update.table([("verl", experiment, result, "")])
    assert "| verl | rebn | token-mean |" in table and "pass" in table


@pytest.mark.parametrize("fault", FAULTS)
def test_the_check_fails_on_an_injected_fault(work, fault):
    """A wrong lr, a missing KL coefficient, a wrong clip ratio, another loss aggregation, an infra-failed row
    counted: each on verl's side (its composed config, or the episode's flag), each reported as a difference above the
    tolerance."""
    result, theirs, _ = same_update.check_here("verl", work, experiment_of(work), fault=fault)
    assert not result.ok
    if fault == "infra":  # its turns enter ReBN's statistics: every advantage moves
        assert theirs.stats[0]["gem/infra_failed_episodes"] == 0
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result


def test_verl_seq_mean_counts_every_row_of_the_mini_batch(work):
    """A documented difference of verl's algorithm: ``seq-mean-token-mean`` divides by ``global_batch_size`` (the
    mini-batch's rows, ``ppo_mini_batch_size x rollout.n``), the infra-failed row (no model token) counted: on two
    mini-batches of 4 rows, the first step's loss is 3/4 of the mean over its healthy rows. The update equals the
    reference's with that divisor."""
    experiment = experiment_of(work, loss_aggregation="seq-mean-token-mean", mini_batches=2)
    result, theirs, _ = same_update.check_here("verl", work, experiment)
    assert result.ok, result
    assert theirs.steps == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2 and INFRA_EPISODE in theirs.steps[0]
    healthy = reference_update(load(work), verl_update.semantics(experiment).replace(seq_rows="healthy"), steps=theirs.steps)
    assert theirs.stats[0]["loss"] == pytest.approx(healthy.stats[0]["loss"] * 3 / 4, rel=1e-5)


def test_the_mappings_warmup_counts_updates_as_verls_scheduler_does(work, fault_free):
    """verl steps its lr scheduler once an update (after the update's last mini-batch; here 1 scheduler step for 2
    optimizer steps), so the plugin writes ``lr_warmup_steps = warmup_updates`` (a defect this check found: it wrote
    ``warmup_updates x optimizer steps per update``, and verl's second update still ran at half the rate). verl's
    warm-up rises from 0 (documented in docs/experiments.md); it is over after the experiment's warm-up updates."""
    import torch
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    assert len(fault_free.steps) == 2 and {s["scheduler_steps"] for s in fault_free.stats} == {1.0}
    e = experiment_of(work, warmup_updates=1)
    optim = verl_update.composed_config(e, work).actor_rollout_ref.actor.optim
    assert optim.lr_warmup_steps == e.warmup_updates == 1 and e.optimizer_steps_per_update == 2
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=optim.lr_warmup_steps)  # verl's engine's
    rates = []
    for _update in range(3):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()  # once an update, as verl's train_mini_batch
    assert rates == pytest.approx([0.0, e.lr, e.lr])  # the experiment's warm-up is over after update 0, verl's too
    with pytest.raises(ValueError, match="warmup_updates"):
        verl_update.semantics(e)
