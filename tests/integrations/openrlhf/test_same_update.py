"""Tier 1 for OpenRLHF (issue 64): the recorded batch and weights through OpenRLHF 0.11.2's own PPO actor update
(the plugin's ReBN advantage step, ``make_experience``, ``ActorPPOTrainer.ppo_train`` with ``PolicyLoss`` and its
KL loss; DeepSpeed's engine replaced by torch AdamW over float32 masters with its 1/gas scaling, see
``benchmarks/tier1/openrlhf_update.py``) equal the reference update under OpenRLHF's declared semantics, and the
check fails on each injected fault.

The batch (8 episodes of portable.toml's GuessTheNumber, groups of 2, one flagged as failed by the
infrastructure) and the check's settings (a KL term, two optimizer steps, lr 1e-3 so that ratios leave the clip)
are those of ``python benchmarks/same_update.py --episodes 8``. The training micro-batch size is the user's: the
command runs OpenRLHF's default, 1 (the failed row a micro-batch of its own, which stopped ``ppo_train`` before the
plugin's ``training_step`` patch), and a test runs 4 (``openrlhf_update.MICRO_BATCH_SIZES``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402
from tier1 import openrlhf_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import ADVANTAGE_EPS32, WEIGHT_TOLERANCE, Update, compare, reference_update  # noqa: E402

EPISODES = 8


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    out = tmp_path_factory.mktemp("tier1")
    same_update.prepare(ROOT / "examples" / "experiments" / "portable.toml", out, EPISODES)
    return out


def experiment_of(work: Path, **changes):
    return same_update.saved_experiment(work, **changes)


def checked(work: Path, experiment, **kwargs):
    return same_update.check_here("openrlhf", work, experiment, **kwargs)


def test_the_mapping_is_what_openrlhf_runs(work, tmp_path):
    """The check's OpenRLHF arguments are the plugin's mapping (OpenRLHF's default micro-batch size, 1, or the
    size a user appends)."""
    experiment = experiment_of(work)
    args = openrlhf_update.parsed_arguments(experiment, work)
    assert (args.algo.advantage.estimator, args.algo.kl.use_loss, args.algo.kl.init_coef) == ("rebn", True, experiment.kl_coef)
    assert args.algo.kl.unbiased_gradient is False and args.actor.dual_clip is None
    assert args.algo.advantage.is_correction_level == "off"  # old log-probs: the actor's at the update's start
    assert (args.train.batch_size, args.train.micro_batch_size, args.train.max_epochs) == (EPISODES, 1, 2)
    assert openrlhf_update.MICRO_BATCH_SIZES == (1, 4)
    assert openrlhf_update.parsed_arguments(experiment, work, micro_batch_size=4).train.micro_batch_size == 4


def test_openrlhf_update_equals_the_reference(work):
    """The command's trainer side (``--run openrlhf``, OpenRLHF's default micro-batch size 1: the failed row is a
    micro-batch of its own) then its comparison: advantages within float32 rounding, the weight change after two
    steps within 1e-3 of the reference's, with the KL on and the clip acting."""
    assert same_update.main(["--run", "openrlhf", "--out", str(work)]) == 0
    theirs = Update.load(work / "openrlhf.pt")
    experiment = experiment_of(work)
    ours = reference_update(load(work), openrlhf_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert len(theirs.stats) == 2 * EPISODES and all(math.isfinite(s["policy_loss"]) for s in theirs.stats)  # 16 micro-batches
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * np.abs(ours.advantages).max())
    assert result.advantage_difference <= result.advantage_tolerance
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    assert experiment.kl_coef > 0 and len(theirs.steps) == 2 and max(s["clip_fraction"] for s in ours.stats) > 0.02
    assert [sorted(step) for step in theirs.steps] == [list(range(EPISODES))] * 2  # every row once per epoch
    assert not theirs.advantages[INFRA_EPISODE].any()
    table = same_update.table([("openrlhf", experiment, result, "")])
    assert "| openrlhf | rebn | token-mean |" in table and "pass" in table


def test_openrlhf_update_at_micro_batches_of_4_equals_the_reference(work):
    """The same check with ``--train.micro_batch_size 4`` appended, as a user would (gas 2: DeepSpeed's 1/gas
    scaling over micro-batches of several rows, the failed row among healthy ones)."""
    result, theirs, _ = checked(work, experiment_of(work), micro_batch_size=4)
    assert result.ok, result
    assert len(theirs.stats) == 4 and [sorted(step) for step in theirs.steps] == [list(range(EPISODES))] * 2


@pytest.mark.parametrize("fault", ["lr", "kl", "clip", "aggregation", "infra"])
def test_the_check_fails_on_an_injected_fault(work, fault):
    """A wrong lr, a missing KL coefficient, a wrong clip ratio, another loss aggregation, an infra-failed row
    counted: each on OpenRLHF's side (its parsed arguments, or the episode's flag), each reported as a
    difference above the tolerance."""
    result, _, _ = checked(work, experiment_of(work), fault=fault)
    assert not result.ok
    if fault == "infra":  # its turns enter ReBN's statistics: every advantage moves
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result


def test_openrlhf_seq_mean_counts_healthy_rows_only(work):
    """Documented differences of OpenRLHF's algorithm: ``seq-mean-token-mean`` divides by the step's rows that
    have a model token (``global_batch_size``), the infra-failed row not counted (TRL counts it); and the KL loss
    stays a token-mean whatever the loss aggregation. Two mini-batches."""
    experiment = experiment_of(work, loss_aggregation="seq-mean-token-mean", mini_batches=2)
    result, theirs, _ = checked(work, experiment)
    assert result.ok, result
    assert len(theirs.steps) == 4
    counted = reference_update(load(work), openrlhf_update.semantics(experiment).replace(seq_rows="all"), steps=theirs.steps)
    assert compare(theirs, counted).weight_difference > WEIGHT_TOLERANCE
    kl_like_the_loss = reference_update(load(work), openrlhf_update.semantics(experiment).replace(kl_aggregation=""), steps=theirs.steps)
    assert compare(theirs, kl_like_the_loss).weight_difference > WEIGHT_TOLERANCE
