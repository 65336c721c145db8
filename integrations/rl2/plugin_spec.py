"""The RL2 plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing it imports neither RL2 nor torch. :data:`PLUGIN`: rl-square 0.0.x (RL2 HEAD's setup.py also
says 0.0.2, so the version alone cannot tell the two apart; the env module exports both contracts and
RL2 calls the one it knows), and ReBN installed as one :class:`~gem_core.plugins.Patch` of
``RL2.trainer.ppo.compute_advantages``, the name RL2's PPO trainer looks up when it computes
advantages (:mod:`gem_integrations.rl2.advantage`), and a patch of ``RL2.utils.algorithms.compute_reinforce_adv``
that leaves infra-failed trajectories out of RL2's own REINFORCE baseline, and one of
``RL2.trainer.ppo.PPOTrainer.get_dataloader`` that keeps the training rows in order where
``train_data.shuffle`` is false (:mod:`gem_integrations.rl2.data_order`). The launcher (``gem-core rl2
train``) installs them.
"""

from __future__ import annotations

from gem_core.plugins import Patch, TrainerPlugin
from gem_integrations.rl2 import advantage, data_order

TARGET_MODULE = "RL2.trainer.ppo"
ALGORITHMS_MODULE = "RL2.utils.algorithms"

PLUGIN = TrainerPlugin(
    name="rl2",
    distribution="rl-square",
    supported=">=0.0.2,<0.1",
    module="RL2",
    estimators=(advantage.ESTIMATOR,),
    patches=(
        Patch(TARGET_MODULE, "compute_advantages", advantage.make_compute_advantages),
        # idle unless the step leaves infra-failed trajectories out of RL2's own REINFORCE baseline
        Patch(ALGORITHMS_MODULE, "compute_reinforce_adv", advantage.make_compute_reinforce_adv),
        # idle unless the config says +train_data.shuffle=false (an experiment's rows: the run's order)
        # (rl-square 0.0.2's; RL2 HEAD loads its rows in its rollout worker, where this patch has nothing to replace)
        Patch(f"{TARGET_MODULE}:PPOTrainer", "get_dataloader", data_order.make_get_dataloader, optional=True),
    ),
    dataset="gem_integrations.rl2.dataset",
    commands="gem_integrations.rl2.commands",
    experiment="gem_integrations.rl2.experiment",
    description="RL2 (rl-square 0.0.2 / HEAD): the GEM env module (rollout.env_path) and ReBN over turns for adv.estimator=reinforce through the gem-core rl2 train launcher",
)
