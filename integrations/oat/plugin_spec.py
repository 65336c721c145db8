"""The oat plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing it imports neither oat nor torch. oat has no advantage registry and needs no patch: ReBN is
oat's own ``PPOMultiTurnLearner`` with the settings of :func:`gem_integrations.oat.advantage.rebn_args`
(the launcher applies them), and the actor is a subclass (:class:`gem_integrations.oat.rollout.GemActor`).
"""

from __future__ import annotations

from gem_core.plugins import TrainerPlugin

PLUGIN = TrainerPlugin(
    name="oat",
    distribution="oat-llm",
    supported=">=0.2,<0.3",
    module="oat",
    estimators=("rebn",),
    dataset="gem_integrations.oat.dataset",
    commands="gem_integrations.oat.commands",
    experiment="gem_integrations.oat.experiment",
    description="oat (oat-llm 0.2.x): a PPOMultiTurnActor over gem_core's runner and ReBN as PPOMultiTurnLearner settings (no critic, turn returns, global whitening)",
)
