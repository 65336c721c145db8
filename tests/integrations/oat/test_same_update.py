"""Tier 1 for oat (issue 64): the recorded batch and weights through oat 0.2.4's own multi-turn learner update (the
plugin's actor and ReBN whitening, oat's ``process_feedback_data``, ``learn`` and ``learning_step`` with its PPO loss,
truncated importance sampling and k3 KL; DeepSpeed's engine replaced by torch AdamW with its 1/gas scaling, its
accumulation boundary and its ``set_train_batch_size``, see ``benchmarks/tier1/oat_update.py``), with the plugin's
own ``--train-batch-size``, equal the reference update under oat's declared semantics (a row per turn, each row's
token mean, one optimizer step per pass), and the check fails on each injected fault.

The batch (8 episodes of turn.toml's GuessTheNumber, one per start state, one flagged as failed by the
infrastructure) and the check's settings (a KL term, two optimizer steps, lr 1e-3 so that ratios leave the clip)
are those of ``python benchmarks/same_update.py --experiment examples/experiments/turn.toml --episodes 8``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402
from tier1 import oat_update  # noqa: E402
from tier1.batch import load  # noqa: E402
from tier1.reference import ADVANTAGE_EPS32, WEIGHT_TOLERANCE, Update, compare, reference_update, rows_of  # noqa: E402

EPISODES = 8
TURN = ROOT / "examples" / "experiments" / "turn.toml"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    out = tmp_path_factory.mktemp("tier1")
    same_update.prepare(TURN, out, EPISODES)
    return out


def experiment_of(work: Path, **changes):
    return same_update.saved_experiment(work, **changes)


@pytest.fixture(scope="module")
def turn_rows(work):
    """The reference's rows (one per turn) and which of them are the infra-failed episode's."""
    recorded = load(work)
    rows, batch = rows_of(recorded, 0, "turn")
    return rows, [i for i, failed in enumerate(rows.failed) if failed]


@pytest.fixture(scope="module")
def oat_result(work):
    """The command's trainer side (``--run oat``), once: oat's update as saved."""
    assert same_update.main(["--run", "oat", "--out", str(work)]) == 0
    return Update.load(work / "oat.pt")


@pytest.fixture(scope="module")
def reference(work):
    """The reference update with oat's semantics, every turn row in each of its two steps (oat's steps hold every
    row the learner got, in a permuted order, which changes the reference's sums by rounding only)."""
    return reference_update(load(work), oat_update.semantics(experiment_of(work)))


def test_the_mapping_is_what_oat_runs(work):
    """The check's oat arguments are the plugin's mapping (plus ``--gpus 1`` and the reference model's path), oat's
    own parser and validation: per-turn rows, ReBN's whitening, the KL in the loss, oat's truncated importance
    sampling kept, every turn of an update in oat's buffers."""
    from gem_integrations.oat.experiment import TURN_CAP

    experiment = experiment_of(work)
    args = oat_update.parsed_arguments(experiment, work)
    assert (args.critic_type, args.whiten_adv, args.gamma, args.lam, args.train_batch_size_per_device) == ("grpo", True, experiment.gamma, 1.0, 1)
    assert (args.beta, args.kl_penalty_coef, args.cliprange, args.num_ppo_epochs) == (experiment.kl_coef, 0.0, experiment.clip_low, 2)
    assert args.tis_c == oat_update.OAT_TIS_C and not args.reinforce_update and args.ref_pretrain == str(work / "ref")
    turns = EPISODES * TURN_CAP
    assert args.rollout_batch_size_per_device == args.pi_buffer_maxlen_per_device == args.train_batch_size == turns
    assert (args.bf16, args.flash_attn, args.lr_scheduler, args.lr_warmup_ratio) == (False, False, "constant", 0.0)


def test_oat_update_equals_the_reference(work, oat_result, turn_rows):
    """Advantages within float32 rounding, the weight change after two steps within 1e-3 of the reference's, with
    the KL on and the clip acting; each step holds every healthy turn row once; the failed episode never trains."""
    rows, failed = turn_rows
    theirs = oat_result
    experiment = experiment_of(work)
    ours = reference_update(load(work), oat_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * np.abs(ours.advantages).max())
    assert result.advantage_difference <= result.advantage_tolerance, result
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    assert experiment.kl_coef > 0 and len(theirs.steps) == 2 and max(s["clip_fraction"] for s in ours.stats) > 0.02
    healthy = [i for i in range(len(rows.failed)) if i not in failed]
    assert failed and [sorted(step) for step in theirs.steps] == [healthy] * 2
    assert not theirs.advantages[failed].any() and len({int(rows.mask[i].sum()) for i in healthy}) > 1  # rows of several lengths
    table = same_update.table([("oat", experiment, result, "")])
    assert "| oat | rebn | seq-mean-token-mean |" in table and "pass" in table


@pytest.mark.parametrize("fault", ["lr", "kl", "clip", "aggregation", "infra"])
def test_the_check_fails_on_an_injected_fault(work, reference, fault):
    """A wrong lr, a missing KL coefficient, a wrong clip ratio, another loss aggregation (``--critic-type
    drgrpo``), an infra-failed row counted: each on oat's side (its parsed arguments, or the episode's flag), each
    reported as a difference above the tolerance."""
    result = compare(oat_update.run(work, experiment_of(work), fault=fault), reference)
    assert not result.ok
    if fault == "infra":  # its turns enter ReBN's statistics: every advantage moves
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result


def test_oat_truncated_importance_sampling_is_part_of_its_update(work, oat_result):
    """A documented difference of oat's algorithm: the policy loss is weighted by min(exp(old - rollout), 2) (``--tis-c``,
    oat's default, which the plugin leaves), the old log-probs being the learner's at the update's start. The
    reference without it, or with the rollout's log-probs as the old ones, is another update."""
    semantics = oat_update.semantics(experiment_of(work))
    for other in (semantics.replace(tis_cap=0.0), semantics.replace(tis_cap=0.0, old_logprobs="rollout")):
        assert compare(oat_result, reference_update(load(work), other, steps=oat_result.steps)).weight_difference > WEIGHT_TOLERANCE


def test_the_plugins_train_batch_size_update_equals_the_reference(work, oat_result):
    """The defect the check found (issue 64, fixed in ``GemLearner``): the plugin's ``--train-batch-size`` (every turn
    an update can hold, 8 x 100 here) is DeepSpeed's accumulation count, more than the update's turn rows times its
    passes, so DeepSpeed stepped no weight and oat's ``learning_step`` failed on its metrics of the steps made (the
    max of no gradient norm). The update oat runs with that value equals the reference's (the tolerances above)."""
    from gem_integrations.oat.experiment import TURN_CAP

    experiment = experiment_of(work)
    theirs = oat_result
    assert theirs.stats[0]["train_batch_size"] == oat_update.parsed_arguments(experiment, work).train_batch_size == EPISODES * TURN_CAP
    result = compare(theirs, reference_update(load(work), oat_update.semantics(experiment), steps=theirs.steps))
    assert result.advantage_difference <= result.advantage_tolerance, result
    assert result.weight_difference <= WEIGHT_TOLERANCE, result


def test_an_update_with_fewer_rows_than_the_accumulation_count_steps_once_per_pass(work, oat_result, turn_rows):
    """Fails without the fix: with DeepSpeed's accumulation count from the plugin's ``--train-batch-size`` (800) above
    the update's turn rows times its passes (2), the update still takes one optimizer step per pass, each over
    every healthy turn row once."""
    rows, failed = turn_rows
    healthy = [i for i in range(len(rows.failed)) if i not in failed]
    passes = experiment_of(work).ppo_epochs
    assert oat_result.stats[0]["train_batch_size"] > len(healthy) * passes and passes == 2
    assert [sorted(step) for step in oat_result.steps] == [healthy] * passes
