"""The OpenRLHF plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing it imports neither OpenRLHF nor torch: the ``gem-core`` command reads it to add
``make-dataset openrlhf`` and ``gem-core openrlhf ...``. :data:`PLUGIN` is a
:class:`gem_core.plugins.TrainerPlugin`: OpenRLHF 0.11.x, and the ``rebn`` estimator installed as one
:class:`~gem_core.plugins.Patch` of ``RemoteExperienceMaker.compute_advantages_and_returns`` (OpenRLHF
has no advantage registry; uninstalling puts the original back, and every other estimator runs the
original unchanged, except that infra-failed rows are left out of its baselines through a second patch,
of ``compute_reward`` as ``experience_maker`` imports it: see :mod:`gem_integrations.openrlhf.advantage`).

:func:`setup_worker` is the Ray ``worker_process_setup_hook`` the launcher sets. It runs in every Ray
worker, vLLM engine actors included, so it imports nothing: OpenRLHF keeps deepspeed out of its vLLM
processes (``openrlhf/trainer/ray/__init__.py``: "No implicit imports of deepspeed here to avoid vllm
environment gets contaminated"), and ``experience_maker`` imports deepspeed. The hook arms an import
hook instead: the patch is applied right after ``openrlhf.trainer.ppo_utils.experience_maker`` is
first imported, which only the process that computes advantages (OpenRLHF's PPO trainer) does; if it
is already imported, the patch is applied at once.
"""

from __future__ import annotations

import sys
from typing import Any

from gem_core.plugins import Patch, TrainerPlugin, cancel_when_imported, waiting_for_import, when_imported
from gem_integrations.openrlhf import advantage

TARGET_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"

PLUGIN = TrainerPlugin(
    name="openrlhf",
    distribution="openrlhf",
    supported=">=0.11,<0.12",
    module="openrlhf",
    estimators=(advantage.ESTIMATOR,),
    patches=(
        Patch(f"{TARGET_MODULE}:RemoteExperienceMaker", "compute_advantages_and_returns", advantage.make_compute_advantages),
        Patch(TARGET_MODULE, "compute_reward", advantage.make_compute_reward),  # idle unless a step leaves infra-failed rows out
    ),
    dataset="gem_integrations.openrlhf.dataset",
    commands="gem_integrations.openrlhf.commands",
    experiment="gem_integrations.openrlhf.experiment",
    description="OpenRLHF 0.11: the GEM agent file (--train.agent_func_path) and rebn through the gem-core openrlhf train launcher",
)


def armed() -> bool:
    """Whether this process patches ``experience_maker`` when it is imported, or already has."""
    return waiting_for_import(TARGET_MODULE) or (TARGET_MODULE in sys.modules and PLUGIN.is_installed)


def disarm() -> None:
    """Remove the import hook (the patch, if applied, stays)."""
    cancel_when_imported(TARGET_MODULE)


def _install(_module: Any = None) -> None:
    PLUGIN.install()


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: patch now if ``experience_maker`` is loaded, else on its import."""
    when_imported(TARGET_MODULE, _install)
