"""Tier 1 for RL2 (issue 64): the recorded batch and weights through rl-square 0.0.2's own PPO training step (its
``PPOTrainer`` built from the plugin's mapping composed with RL2's ``ppo.yaml``, one ``train()`` step: its rollout over
the plugin's 0.0.2 env module, old and reference log-probs, the plugin's ReBN ``compute_advantages``, ``Actor.update``
under RL2's FSDP on a one-process gloo group; SGLang replaced by the recorded responses, see
``benchmarks/tier1/rl2_update.py``) equal the reference update under RL2's declared semantics, and the check fails on
each injected fault.

The batch (8 episodes of portable.toml's GuessTheNumber, groups of 2, one flagged as failed by the infrastructure) and
the check's settings (a KL term, two optimizer steps, lr 1e-3 so that ratios leave the clip) are those of ``python
benchmarks/same_update.py --episodes 8``; RL2 makes one pass over a rollout, so its two steps are two mini-batches
(``actor.update_per_rollout = 2``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gem_core.experiment import UnsupportedSettingError

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402
from helpers import tier1 as tier1_helpers  # noqa: E402
from tier1 import rl2_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import (  # noqa: E402
    ADVANTAGE_EPS32,
    FAULTS,
    WEIGHT_TOLERANCE,
    Update,
    compare,
    kl_term,
    reference_update,
    response_logprobs,
    rows_of,
)

EPISODES = 8


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tier1_helpers.prepared(tmp_path_factory, "tier1-rl2")


experiment_of = tier1_helpers.experiment_of


def checked(work: Path, experiment, **kwargs):
    return same_update.check_here("rl2", work, experiment, **kwargs)


def test_the_batch_is_sensitive(work):
    """Different lengths, turns of both signs, one failed episode, old log-probs and the reference model both away
    from the actor."""
    tier1_helpers.assert_batch_is_sensitive(work, rl2_update.semantics(experiment_of(work)))


def test_the_mapping_is_what_rl2_runs(work):
    """The check's RL2 config is the plugin's mapping composed with RL2's ``ppo.yaml`` (plus the user's memory and path
    settings): the experiment's two epochs as RL2's two mini-batches, the KL in the loss, ReBN, no dynamic filtering."""
    experiment = experiment_of(work)
    assert experiment.ppo_epochs == 2 and experiment.mini_batches == 1
    expressed = rl2_update.expressible(experiment)
    assert (expressed.ppo_epochs, expressed.mini_batches) == (1, 2)
    config = rl2_update.rl2_config(expressed, work, longest=512)
    actor = config.actor
    assert (actor.update_per_rollout, actor.avg_level, actor.clip, actor.lr) == (2, "token", experiment.clip_low, experiment.lr)
    assert (actor.kl.coef, actor.kl.type, actor.kl.loss_estimator) == (experiment.kl_coef, "loss", "k3")
    assert (actor.weight_decay, actor.max_grad_norm, actor.scheduler, actor.warmup_ratio) == (0.0, experiment.max_grad_norm, "constant_with_warmup", 0.0)
    assert (actor.tis_coef, actor.freeze_steps, actor.entropy.coef) == (0.0, 0, 0.0)
    assert config.rollout.dynamic_filtering is False and config.trainer.n_epochs == 1
    assert (config.adv.estimator, config.adv.rebn, config.adv.gamma) == ("reinforce", True, experiment.gamma)
    assert config.ref_actor.model_name == str(work / "rl2-ref") and actor.model_name == str(work / "rl2-actor")
    semantics = rl2_update.semantics(experiment)
    assert (semantics.steps, semantics.epochs, semantics.seq_rows, semantics.kl_aggregation) == (2, 1, "all", "token-mean")


def _gradient_free_kl(work: Path, experiment, step: list[int]) -> float:
    """What RL2's logged loss of a step holding the infra-failed row adds to the reference's: the plugin masks that row
    after RL2 computed its reference log-probs, so its KL term is ``k3(0 - ref)`` on its model tokens (``logps`` are
    ``(...) * action_mask``, 0 there, and carry no gradient), over the step's action tokens, times the coefficient."""
    import torch
    from transformers import AutoModelForCausalLM

    recorded = load(work)
    rows, _ = rows_of(recorded, 0)
    failed = recorded.trajectories[INFRA_EPISODE]
    tokens = torch.tensor(failed.as_sequence().loss_mask, dtype=torch.float32)
    with torch.no_grad():
        ref = response_logprobs(AutoModelForCausalLM.from_pretrained(work / "ref"), rows, [INFRA_EPISODE])[0, : len(tokens)]
    kl = (kl_term(torch.zeros_like(ref), ref, "k3") * tokens).sum()
    return float(experiment.kl_coef * kl / rows.mask[step].sum())


def test_rl2_update_equals_the_reference(work):
    """The command's trainer side (``--run rl2``) then its comparison: advantages within float32 rounding, the weight
    change after two steps within 1e-3 of the reference's, with the KL on and the clip acting; RL2's rollout asked the
    stand-in for every recorded turn with the experiment's sampling settings; the rows in order, each once."""
    assert same_update.main(["--run", "rl2", "--out", str(work)]) == 0
    theirs = Update.load(work / "rl2.pt")
    experiment = experiment_of(work)
    ours = reference_update(load(work), rl2_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * np.abs(ours.advantages).max())
    assert result.advantage_difference <= result.advantage_tolerance
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    assert experiment.kl_coef > 0 and len(theirs.steps) == 2 and max(s["clip_fraction"] for s in ours.stats) > 0.02
    assert [sorted(step) for step in theirs.steps] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # torch.chunk of the rollout's order
    assert not theirs.advantages[INFRA_EPISODE].any()

    seen = rl2_update.LAST_RUN["seen"]
    recorded = load(work)
    assert sorted(seen["requests"]) == [(e, t) for e, trajectory in enumerate(recorded.trajectories) for t in range(trajectory.num_turns)]
    for params in seen["sampling"]:
        assert (params["max_new_tokens"], params["temperature"], params["skip_special_tokens"]) == (experiment.max_turn_tokens, experiment.temperature, False)

    # the logged loss: the reference's on the healthy step; on the step holding the failed row, plus its gradient-free KL
    failed_step = next(k for k, step in enumerate(theirs.steps) if INFRA_EPISODE in step)
    other = 1 - failed_step
    assert theirs.stats[other]["loss"] == pytest.approx(ours.stats[other]["loss"], rel=1e-4)
    extra = _gradient_free_kl(work, experiment, theirs.steps[failed_step])
    assert extra > 0.05
    assert theirs.stats[failed_step]["loss"] == pytest.approx(ours.stats[failed_step]["loss"] + extra, rel=1e-4)
    table = same_update.table([("rl2", experiment, result, "")])
    assert "| rl2 | rebn | token-mean |" in table and "pass" in table


@pytest.mark.parametrize("fault", FAULTS)
def test_the_check_fails_on_an_injected_fault(work, fault):
    """A wrong lr, a missing KL coefficient, a wrong clip ratio, another loss aggregation (``avg_level = "sequence"``,
    run with its clip metric mended), an infra-failed episode not reported by its env: each on RL2's side (its composed
    config, or the env), each reported as a difference above the tolerance."""
    result, _, _ = checked(work, experiment_of(work), fault=fault)
    assert not result.ok
    if fault == "infra":  # its turns enter ReBN's statistics: every advantage moves
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result


def test_the_plugin_refuses_the_sequence_level_that_rl2_cannot_run(work):
    """``seq-mean-token-mean`` would be RL2's ``avg_level = "sequence"``, which rl-square 0.0.2's ``Actor.update``
    cannot run (its bool clip-ratio metric through ``torch.finfo``, on every update): the plugin refuses it in one
    line naming the key, and RL2 given it anyway raises."""
    with pytest.raises(UnsupportedSettingError, match="^rl2 cannot run this experiment: algorithm.loss_aggregation"):
        rl2_update.run(work, experiment_of(work, loss_aggregation="seq-mean-token-mean"))
    with pytest.raises(TypeError, match=re.escape(rl2_update.SEQUENCE_LEVEL_DEFECT)):
        rl2_update.run(work, experiment_of(work), overrides={"actor.avg_level": "sequence"})


def test_rl2_default_dynamic_filtering_would_drop_a_group(work):
    """Why the mapping pins ``rollout.dynamic_filtering = false``: RL2's default drops every group whose rewards are
    equal (here the first: both its episodes win), so the update would train 6 of the 8 episodes."""
    with pytest.raises(ValueError, match="holds 6 sequences for 8 episodes"):
        rl2_update.run(work, experiment_of(work), overrides={"rollout.dynamic_filtering": True})
