"""Tier 1 for ROLL (issue 64): the recorded batch and weights through ROLL's own agentic pipeline step (its
``AgenticPipeline.run``, reference and actor workers, agentic ``loss_func`` and FSDP2 strategy, from ROLL's source) equal
the reference update under ROLL's declared semantics (benchmarks/tier1/roll_update.py), and the check fails on each
injected fault.

The batch: examples/experiments/turn_steps.toml (ROLL's terms: a row per turn, reinforce, an optimizer step per 32 turn
samples) made sensitive as ``python benchmarks/same_update.py`` makes it (a KL term, two epochs, lr 1e-3 so that ratios
leave the clip), on :data:`EPISODES` episodes (one flagged as failed by the infrastructure) and with
``max_context_tokens`` :data:`CONTEXT`: ROLL pads every turn sample to that length (``sequence_length``), which costs time
and changes nothing (the batch's longest sample has 232 tokens); the command runs the file's own 1024 on 32 episodes.

Why 26 episodes: 66 healthy turns, two optimizer steps of 32 an epoch (four in all: the ratios leave the clip in the
second epoch), and a remainder of 2. ROLL drops the remainder at random before its advantages, so a row it drops never
trains: with the ``infra`` fault the flagged episode's one turn is among 67 rows of which 3 go, and it trains (asserted);
on the 32-episode batch it is among 82 of which 18 go, and ROLL's seeded draw drops it: that update is then a correct one
and no check could fail it.

Runs in ROLL's own Python (``nox -s roll_src``, or ``.nox/roll_src/bin/python -m pytest`` where that session's
virtualenv exists, ROLL's source from ``ROLL_SRC`` or the pinned copy beside the checkout); skipped where ROLL, torch
or Ray do not import (``nox -s roll``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCE = Path(os.environ.get("ROLL_SRC") or ROOT.parent / "shared" / "third_party" / "ROLL")
if not (SOURCE / "roll" / "pipeline" / "agentic").is_dir():
    pytest.skip(f"no ROLL checkout at {SOURCE}: the Tier 1 check of ROLL runs ROLL's own code (ROLL_SRC=path nox -s roll_src)", allow_module_level=True)
for needed in ("torch", "ray", "hydra", "dacite", "transformers"):
    if importlib.util.find_spec(needed) is None:
        pytest.skip(f"{needed} is not installed: the Tier 1 check of ROLL runs in nox -s roll_src's virtualenv", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

import same_update  # noqa: E402
from gem_core.experiment import load_experiment, to_toml  # noqa: E402
from tier1 import roll_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import ADVANTAGE_EPS32, FAULTS, WEIGHT_TOLERANCE, Update, advantages, compare, reference_update, rows_of  # noqa: E402

FILE = ROOT / "examples" / "experiments" / "turn_steps.toml"
EPISODES = 26
CONTEXT = 256


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The recorded batch (``same_update.prepare`` of turn_steps.toml at :data:`CONTEXT`), and one local Ray instance
    for every ROLL run of the module (ROLL's model-path cache is a Ray actor)."""
    import ray

    out = tmp_path_factory.mktemp("tier1-roll")
    source = out / "turn_steps.toml"
    source.write_text(to_toml(dataclasses.replace(load_experiment(FILE), max_context_tokens=CONTEXT)))
    same_update.prepare(source, out, EPISODES)
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield out
    if started:
        ray.shutdown()


def experiment_of(work: Path, **changes):
    return same_update.saved_experiment(work, **changes)


def test_the_batch_is_sensitive(work):
    """Turn rows of episodes of different lengths, more healthy turns than an optimizer step takes (so ROLL drops a
    remainder), returns of both signs, one failed episode; the old log-probs (the actor's) and the reference's apart."""
    import torch
    from transformers import AutoModelForCausalLM

    recorded = load(work)
    experiment = experiment_of(work)
    assert experiment.view == "turn" and experiment.estimator == "reinforce" and experiment.kl_coef > 0 and experiment.ppo_epochs == 2
    assert len({t.num_turns for t in recorded.trajectories}) >= 3
    assert recorded.failed == [i == INFRA_EPISODE for i in range(EPISODES)]
    rows, batch = rows_of(recorded, 0, "turn")
    healthy = len(batch) - sum(rows.failed)
    assert healthy > experiment.turns_per_step and healthy % experiment.turns_per_step
    adv = advantages(batch, roll_update.semantics(experiment))
    failed_rows = [i for i, failed in enumerate(rows.failed) if failed]
    assert adv.max() > 0.5 and adv.min() < -0.05 and not adv[failed_rows].any()
    everyone = list(range(len(batch)))
    from tier1.reference import response_logprobs

    with torch.no_grad():
        actor = response_logprobs(AutoModelForCausalLM.from_pretrained(work / "actor"), rows, everyone)
        ref = response_logprobs(AutoModelForCausalLM.from_pretrained(work / "ref"), rows, everyone)
    assert (actor - ref)[rows.mask.bool()].abs().mean() > 0.05


def test_roll_update_equals_the_reference(work):
    """The command's trainer side (``--run roll``) then its comparison: ROLL's float32 returns within one float32 ulp
    of the reference's, the weight change after the steps within 1e-3 of the reference's, with the KL on and the clip
    acting; steps of turns_per_step turn samples, ROLL's remainder dropped, the failed episode nowhere."""
    assert same_update.main(["--run", "roll", "--out", str(work)]) == 0
    theirs = Update.load(work / "roll.pt")
    experiment = experiment_of(work)
    ours = reference_update(load(work), roll_update.semantics(experiment), steps=theirs.steps)
    result = compare(theirs, ours)
    assert theirs.advantage_dtype == "float32" and result.advantage_tolerance == pytest.approx(ADVANTAGE_EPS32 * max(np.abs(ours.advantages).max(), 1.0))
    assert result.advantage_difference <= result.advantage_tolerance, result
    assert result.weight_difference <= WEIGHT_TOLERANCE, result
    rows, batch = rows_of(load(work), 0, "turn")
    healthy = len(batch) - sum(rows.failed)
    n = experiment.turns_per_step
    assert [len(step) for step in theirs.steps] == [n] * (experiment.ppo_epochs * (healthy // n))
    dropped = np.isnan(theirs.advantages).all(axis=1)
    failed_rows = [i for i, failed in enumerate(rows.failed) if failed]
    assert dropped.sum() == healthy % n + len(failed_rows) and dropped[failed_rows].all()
    for epoch in range(experiment.ppo_epochs):  # each epoch takes every kept row once
        per_epoch = len(theirs.steps) // experiment.ppo_epochs
        taken = sorted(i for step in theirs.steps[epoch * per_epoch : (epoch + 1) * per_epoch] for i in step)
        assert taken == sorted(np.flatnonzero(~dropped).tolist())
    assert max(s["clip_fraction"] for s in ours.stats) > 0.02
    assert [s["loss"] for s in theirs.stats] == pytest.approx([s["loss"] for s in ours.stats], rel=1e-4)
    table = same_update.table([("roll", experiment, result, "")])
    assert "| roll | reinforce | token-mean |" in table and "pass" in table


@pytest.mark.parametrize("fault", FAULTS)
def test_the_check_fails_on_an_injected_fault(work, fault):
    """A wrong lr, a missing KL coefficient (ROLL's ``kl_loss_coef`` 0: its KL is in the loss, k3, as the reference's),
    a wrong clip ratio, another loss aggregation, an infra-failed episode let through ROLL's group filter: each on
    ROLL's side, each reported as a difference above the tolerance."""
    result, theirs, _ = same_update.check_here("roll", work, experiment_of(work), fault=fault)
    assert not result.ok
    if fault == "infra":  # the failed episode's turn trains with its return, where the reference has none
        rows, _ = rows_of(load(work), 0, "turn")
        failed_rows = [i for i, failed in enumerate(rows.failed) if failed]
        assert any(i in failed_rows for step in theirs.steps for i in step)
        assert result.advantage_difference > 1e3 * result.advantage_tolerance
    assert result.weight_difference > WEIGHT_TOLERANCE, result
