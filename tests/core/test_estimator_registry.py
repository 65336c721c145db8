"""The estimator registry (gem_core.algo.estimators) is the one list of estimators and the one default gamma:
gem-core train's option and config, the experiment file's schema and the TRL plugin's defaults all take theirs
from it, and the trainer's advantages are the registry's."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from gem_core import algo, experiment
from gem_core.algo.estimators import DEFAULT_GAMMA, ESTIMATOR_NAMES, ESTIMATORS, GROUP_ESTIMATORS, estimate
from gem_core.train import trainer

ROOT = Path(__file__).resolve().parents[2]
REWARDS = [[0.0, 0.0, 1.0], [0.0, 0.5], [-0.1], [0.0, 0.0, 0.0, 0.8]]
GROUPS = ["a", "a", "b", "b"]


def test_every_place_lists_the_registrys_estimators():
    assert ESTIMATOR_NAMES == ("rebn", "reinforce", "grpo", "drgrpo", "rloo")
    assert trainer.ESTIMATORS == ESTIMATOR_NAMES
    assert experiment.ESTIMATORS == ESTIMATOR_NAMES
    assert experiment.KEYS["estimator"].param.choices == ESTIMATOR_NAMES
    assert set(experiment.GROUP_ESTIMATORS) == {n for n, e in ESTIMATORS.items() if e.grouped} == {"grpo", "drgrpo", "rloo"}


def test_every_default_gamma_is_the_registrys():
    assert DEFAULT_GAMMA == 0.9
    assert trainer.TrainConfig().gamma == DEFAULT_GAMMA
    assert experiment.Experiment().gamma == DEFAULT_GAMMA
    # the TRL plugin's defaults (read from its source: TRL itself may not be installed here)
    source = (ROOT / "integrations" / "trl" / "advantage.py").read_text()
    assert "gamma: float = DEFAULT_GAMMA" in source and "gamma: float = 0." not in source


@pytest.mark.parametrize("name", ESTIMATOR_NAMES)
def test_the_trainer_uses_the_registry(name):
    np.testing.assert_array_equal(trainer.estimate(REWARDS, GROUPS, name, 0.9), estimate(REWARDS, GROUPS, name, 0.9))


def test_the_registry_computes_what_it_documents():
    flat = estimate(REWARDS, GROUPS, "rebn", 0.9)
    returns = np.asarray(algo.discounted_returns(REWARDS, gamma=0.9))
    np.testing.assert_allclose(flat, (returns - returns.mean()) / (returns.std(ddof=0) + 1e-6))
    np.testing.assert_allclose(estimate(REWARDS, GROUPS, "reinforce", 0.9), returns)
    # gamma moves the discounted estimators only
    assert not np.allclose(estimate(REWARDS, GROUPS, "rebn", 0.5), flat)
    for name in GROUP_ESTIMATORS:
        np.testing.assert_array_equal(estimate(REWARDS, GROUPS, name, 0.5), estimate(REWARDS, GROUPS, name, 0.9))


def test_an_unknown_estimator_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'.*rebn"):
        estimate(REWARDS, GROUPS, "ppo")


def test_the_registry_docstring_names_every_estimator():
    doc = inspect.getmodule(estimate).__doc__
    assert all(f"``{name}``" in doc for name in ESTIMATOR_NAMES)
