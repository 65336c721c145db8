"""An experiment (:mod:`gem_core.experiment`) in ROLL: refused, by name, for what ROLL's agentic pipeline
cannot express.

ROLL trains per-step samples (each turn its own sample) and takes an optimizer step per
``per_device_train_batch_size x gradient_accumulation_steps x dp`` samples (``ActorWorker.train_step``:
``backward_steps = samples x ppo_epochs // backward_batch_size``, after ``batch_adjust_mode`` trims or copies
samples to a multiple of it). An experiment's update takes ``mini_batches`` optimizer steps on however many
turns its episodes played; ROLL's step count follows the turn count instead, so every experiment is refused
on ``training.mini_batches``. Its ReBN (``step_reinforce`` + batch ``mean_std``) also normalises with the
sample std (ddof 1), not the experiment's population std. ``examples/roll/gem_core_rebn.yaml`` remains the
way to run gem-core envs with ReBN in ROLL. Imports nothing from ROLL.
"""

from __future__ import annotations

from gem_core.experiment import Experiment, refuse

TRAINER = "roll"


def check(experiment: Experiment) -> None:
    """Refuse what ROLL cannot run (always ``training.mini_batches``; see the module doc)."""
    raise refuse(
        TRAINER,
        experiment,
        "training.mini_batches",
        "ROLL's optimizer steps count turn samples (per_device_train_batch_size x gradient_accumulation_steps), "
        "so an update's step count follows its turn count; use examples/roll/gem_core_rebn.yaml",
    )


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    check(experiment)
    raise AssertionError("unreachable")  # pragma: no cover
