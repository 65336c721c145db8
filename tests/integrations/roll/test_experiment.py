"""An experiment in ROLL (gem_integrations.roll.experiment) is refused on training.mini_batches: checked here
against the contract read from ROLL's source, and, with ROLL_SRC (the roll_src session), against ROLL's own
ActorWorker.train_step: its optimizer steps are samples x ppo_epochs // (per_device_train_batch_size x
gradient_accumulation_steps), a count of per-step (turn) samples, not of episodes."""

from __future__ import annotations

import inspect
import os
import sys

import pytest

from gem_core.experiment import UnsupportedSettingError, parse_experiment
from gem_integrations.roll.experiment import render


def test_every_experiment_is_refused_naming_the_mini_batches():
    for text in ("", "[training]\nmini_batches = 2\n", '[algorithm]\nview = "turn"\n'):
        with pytest.raises(UnsupportedSettingError) as caught:
            render(parse_experiment(text))
        assert str(caught.value).startswith("roll cannot run this experiment: training.mini_batches=")
        assert "per_device_train_batch_size x gradient_accumulation_steps" in str(caught.value)


@pytest.mark.skipif(not os.environ.get("ROLL_SRC"), reason="ROLL's own code needs a ROLL checkout: ROLL_SRC=path nox -s roll_src")
def test_rolls_train_step_counts_optimizer_steps_in_samples():
    sys.path.insert(0, os.path.abspath(os.environ["ROLL_SRC"]))
    from roll.pipeline.base_worker import ActorWorker

    source = inspect.getsource(ActorWorker.train_step)
    assert "per_device_train_batch_size" in source and "gradient_accumulation_steps" in source
    assert "backward_steps = data.batch.batch_size[0] * self.pipeline_config.ppo_epochs // backward_batch_size" in source
