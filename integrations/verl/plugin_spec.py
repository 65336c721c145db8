"""The verl plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing this module imports nothing from verl: the ``gem-core`` command reads it to add
``make-dataset verl``, and :mod:`gem_integrations.verl.plugin` (verl's own ``verl.plugins`` entry point)
installs it in every verl process. What it installs:

* ``register``: the ``rebn``/``gem_reinforce`` estimators in verl's advantage registry and the
  ``gem_env`` agent loop in verl's agent-loop registry (verl has registries for both: no patch).
* :data:`TURN_IDS_PATCH`: verl 0.9's v1 ``PPOTrainer._compute_advantage`` hands the gem estimators the
  batch's explicit turn ids and, for every estimator, marks and counts the episodes the infrastructure
  failed (:func:`gem_integrations.verl.advantage.wrap_compute_advantage`).
* :data:`INFRA_PATCH`: the step's ``compute_advantage_for_multi_trajectories`` runs verl's estimator on
  the healthy rows alone, so no failed row enters a group's baseline
  (:func:`gem_integrations.verl.advantage.wrap_multi_trajectory_advantage`); a batch without failures
  runs verl's call unchanged.
* :data:`CONFIG_PATCH`: ``PPOTrainer.__init__`` refuses configurations that would lose the per-turn
  rewards (legacy trainer, a reward model) at start-up
  (:func:`gem_integrations.verl.advantage.check_trainer_config`).

The patches revert exactly (:meth:`gem_core.plugins.TrainerPlugin.uninstall`).
"""

from __future__ import annotations

from typing import Any

from gem_core.plugins import Patch, TrainerPlugin

#: The module whose class the patches wrap (imported by verl's driver only, never at ``import verl``).
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def _wrap_compute_advantage(original: Any) -> Any:
    from .advantage import wrap_compute_advantage

    return wrap_compute_advantage(original)


def _wrap_multi_trajectory_advantage(original: Any) -> Any:
    from .advantage import wrap_multi_trajectory_advantage

    return wrap_multi_trajectory_advantage(original)


def _wrap_trainer_init(original: Any) -> Any:
    from .advantage import wrap_trainer_init

    return wrap_trainer_init(original)


def _register() -> None:
    from . import rollout  # noqa: F401  (its @register adds gem_env to verl's agent-loop registry)
    from .advantage import register_estimators

    register_estimators()


TURN_IDS_PATCH = Patch(f"{TRAINER_MODULE}:PPOTrainer", "_compute_advantage", _wrap_compute_advantage)
INFRA_PATCH = Patch(TRAINER_MODULE, "compute_advantage_for_multi_trajectories", _wrap_multi_trajectory_advantage)
CONFIG_PATCH = Patch(f"{TRAINER_MODULE}:PPOTrainer", "__init__", _wrap_trainer_init)

PLUGIN = TrainerPlugin(
    name="verl",
    distribution="verl",
    supported=">=0.9,<0.10",
    module="verl",
    estimators=("rebn", "gem_reinforce"),
    patches=(TURN_IDS_PATCH, INFRA_PATCH, CONFIG_PATCH),
    register=_register,
    dataset="gem_integrations.verl.dataset",
    experiment="gem_integrations.verl.experiment",
    description="verl 0.9: rebn/gem_reinforce estimators, the gem_env agent loop, turn ids and infra-failed rows into the v1 trainer's advantage step",
)
