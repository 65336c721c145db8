"""Tier 1 for TRL (issue 64): the recorded batch and weights through TRL 1.16's own GRPOTrainer update equal the
reference update under TRL's declared semantics (benchmarks/tier1), and the check fails on each injected fault.

The batch (8 episodes of portable.toml's GuessTheNumber, groups of 2, one flagged as failed by the
infrastructure) and the check's settings (a KL term, two optimizer steps, lr 1e-3 so that ratios leave the clip)
are those of ``python benchmarks/same_update.py --episodes 8``.
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
from tier1 import trl_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import ADVANTAGE_EPS32, WEIGHT_TOLERANCE, Update, compare, reference_update  # noqa: E402

EPISODES = 8


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tier1_helpers.prepared(tmp_path_factory, "tier1")


experiment_of = tier1_helpers.experiment_of


def checked(work: Path, experiment, **kwargs):
    return same_update.check_here("trl", work, experiment, **kwargs)


def test_the_batch_is_sensitive(work):
    """Different lengths, turns of both signs, one failed episode, old log-probs and the reference model
    both away from the actor."""
    tier1_helpers.assert_batch_is_sensitive(work, trl_update.semantics(experiment_of(work)))


def test_trl_update_equals_the_reference(work):
    """The command's trainer side (``--run trl``) then its comparison: advantages within float32 rounding, the
    weight change after two steps within 1e-3 of the reference's, with the KL on and the clip acting."""
    assert same_update.main(["--run", "trl", "--out", str(work)]) == 0
    theirs = Update.load(work / "trl.pt")
    experiment = experiment_of(work)
    ours = reference_update(load(work), trl_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * np.abs(ours.advantages).max())
    assert result.advantage_difference <= result.advantage_tolerance
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    assert experiment.kl_coef > 0 and len(theirs.steps) == 2 and max(s["clip_fraction"] for s in ours.stats) > 0.02
    assert not theirs.advantages[INFRA_EPISODE].any()
    assert [s["loss"] for s in theirs.stats] == pytest.approx([s["loss"] for s in ours.stats], rel=1e-4)
    table = same_update.table([("trl", experiment, result, "")])
    assert "| trl | rebn | token-mean |" in table and "pass" in table


@pytest.mark.parametrize("fault", ["lr", "kl", "clip", "aggregation", "infra"])
def test_the_check_fails_on_an_injected_fault(work, fault):
    """A wrong lr, a missing KL coefficient, a wrong clip ratio, another loss aggregation, an infra-failed row
    counted: each on TRL's side, each reported as a difference above the tolerance."""
    result, _, _ = checked(work, experiment_of(work), fault=fault)
    assert not result.ok
    if fault == "infra":  # its turns enter ReBN's statistics: every advantage moves
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result


def test_trl_default_kl_bias_correction_is_another_gradient(work):
    """The mapping defect the check found: TRL 1.16's ``use_bias_correction_kl=True`` (its default) multiplies the
    k3 KL by the ratio, whose gradient is not 0 even where it is 1; the plugin now pins it False."""
    from gem_integrations.trl.experiment import grpo_config

    experiment = experiment_of(work, ppo_epochs=1)  # one step: the ratio's value is exactly 1
    assert grpo_config(experiment)["use_bias_correction_kl"] is False
    result, theirs, ours = checked(work, experiment, overrides={"use_bias_correction_kl": True})
    assert theirs.stats[0]["loss"] == pytest.approx(ours.stats[0]["loss"], rel=1e-5)  # the same loss value...
    assert result.weight_difference > 10 * WEIGHT_TOLERANCE  # ...another gradient


def test_trl_seq_mean_counts_infra_failed_rows(work):
    """A documented difference of TRL's algorithm: ``loss_type="grpo"`` (seq-mean-token-mean) averages over every
    row of the mini-batch, the infra-failed row (no loss token) included: the loss is 7/8 of the mean over
    healthy rows. The update equals the reference's with that divisor."""
    experiment = experiment_of(work, loss_aggregation="seq-mean-token-mean")
    result, theirs, ours = checked(work, experiment)
    assert result.ok, result
    healthy = reference_update(load(work), trl_update.semantics(experiment).replace(seq_rows="healthy"), steps=theirs.steps)
    assert theirs.stats[0]["loss"] == pytest.approx(healthy.stats[0]["loss"] * (EPISODES - 1) / EPISODES, rel=1e-5)
