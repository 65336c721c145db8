"""The OpenRLHF plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing it imports neither OpenRLHF nor torch: the ``gem-core`` command reads it to add
``make-dataset openrlhf`` and ``gem-core openrlhf ...``. :data:`PLUGIN` is a
:class:`gem_core.plugins.TrainerPlugin`: OpenRLHF 0.11.x, and the ``rebn`` estimator installed as one
:class:`~gem_core.plugins.Patch` of ``RemoteExperienceMaker.compute_advantages_and_returns`` (OpenRLHF
has no advantage registry; uninstalling puts the original back, and every other estimator runs the
original unchanged, except that infra-failed rows are left out of its baselines through a second patch,
of ``compute_reward`` as ``experience_maker`` imports it: see :mod:`gem_integrations.openrlhf.advantage`),
and a third patch, of ``ActorPPOTrainer.training_step``, so that a micro-batch or an optimizer step with no
action token (an infra-failed row alone, at ``--train.micro_batch_size 1``) neither stops ``ppo_train``'s
metric averaging with a division by zero nor gets a 0/0 loss (:mod:`gem_integrations.openrlhf.training_step`).
:data:`DATA_ORDER_PATCHES`, apart from the plugin's (they are applied only where OpenRLHF's PPO trainer module is
imported, never by :meth:`PLUGIN.install`, which would import vLLM into the actors): ``prepare_datasets``, in each
module that holds it, so that the launcher's ``--data.shuffle false`` keeps the prompt rows in the dataset's order
(:mod:`gem_integrations.openrlhf.data_order`; inert without it).

:func:`setup_worker` is the Ray ``worker_process_setup_hook`` the launcher sets. It runs in every Ray
worker, vLLM engine actors included, so it imports nothing: OpenRLHF keeps deepspeed out of its vLLM
processes (``openrlhf/trainer/ray/__init__.py``: "No implicit imports of deepspeed here to avoid vllm
environment gets contaminated"), and ``experience_maker`` imports deepspeed. The hook arms import
hooks instead: the patches are applied right after ``openrlhf.trainer.ppo_utils.experience_maker`` is
first imported, which only the process that computes advantages (OpenRLHF's PPO trainer) does, or
``openrlhf.trainer.ray.ppo_actor``, which the actor's training processes (``PolicyModelActor``, where
``training_step`` runs) import; if one is already imported, they are applied at once. Either applies all
three (the other module is imported then; neither is imported by vLLM engine actors). The data-order patches wait in
the same way for ``openrlhf.trainer.ppo_trainer`` and ``openrlhf.trainer.ppo_trainer_async`` (the PPO trainer
actor's modules), each applied in its own module once that module has run (``ppo_trainer`` imports the experience
maker halfway through, before ``prepare_datasets`` is defined).
"""

from __future__ import annotations

import sys
from typing import Any

from gem_core.plugins import Patch, TrainerPlugin, cancel_when_imported, waiting_for_import, when_imported
from gem_integrations.openrlhf import advantage, data_order, training_step

TARGET_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
ACTOR_MODULE = "openrlhf.trainer.ray.ppo_actor"

PLUGIN = TrainerPlugin(
    name="openrlhf",
    distribution="openrlhf",
    supported=">=0.11,<0.12",
    module="openrlhf",
    estimators=(advantage.ESTIMATOR,),
    patches=(
        Patch(f"{TARGET_MODULE}:RemoteExperienceMaker", "compute_advantages_and_returns", advantage.make_compute_advantages),
        Patch(TARGET_MODULE, "compute_reward", advantage.make_compute_reward),  # idle unless a step leaves infra-failed rows out
        Patch(f"{ACTOR_MODULE}:ActorPPOTrainer", "training_step", training_step.make_training_step),  # no change while micro-batches have tokens
    ),
    dataset="gem_integrations.openrlhf.dataset",
    commands="gem_integrations.openrlhf.commands",
    experiment="gem_integrations.openrlhf.experiment",
    description="OpenRLHF 0.11: the GEM agent file (--train.agent_func_path) and rebn through the gem-core openrlhf train launcher",
)


#: ``prepare_datasets`` where OpenRLHF's PPO trainers call it: the rows in order under ``--data.shuffle false``.
DATA_ORDER_PATCHES = (
    Patch(data_order.TRAINER_MODULE, data_order.FUNCTION, data_order.make_prepare_datasets),
    Patch(data_order.ASYNC_TRAINER_MODULE, data_order.FUNCTION, data_order.make_prepare_datasets),
)


def armed() -> bool:
    """Whether this process patches ``experience_maker`` when it is imported, or already has."""
    return waiting_for_import(TARGET_MODULE) or (TARGET_MODULE in sys.modules and PLUGIN.is_installed)


def data_order_armed() -> bool:
    """Whether this process patches ``prepare_datasets`` when OpenRLHF's PPO trainer module is imported, or already
    has."""
    patch = DATA_ORDER_PATCHES[0]
    return waiting_for_import(patch.target) or (patch.target in sys.modules and patch.applied)


def disarm() -> None:
    """Remove the import hooks (the patches, if applied, stay)."""
    cancel_when_imported(TARGET_MODULE)
    cancel_when_imported(ACTOR_MODULE)
    for patch in DATA_ORDER_PATCHES:
        cancel_when_imported(patch.target)


def _install(_module: Any = None) -> None:
    PLUGIN.install()


def _install_data_order(module: Any) -> None:
    for patch in DATA_ORDER_PATCHES:
        if patch.target == module.__name__:
            patch.apply()


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: patch now if ``experience_maker`` or ``ppo_actor`` is loaded, else
    on the first import of either; ``prepare_datasets`` likewise in each PPO trainer module."""
    when_imported(TARGET_MODULE, _install)
    when_imported(ACTOR_MODULE, _install)
    for patch in DATA_ORDER_PATCHES:
        when_imported(patch.target, _install_data_order)
