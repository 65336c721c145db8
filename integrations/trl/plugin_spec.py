"""The TRL plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

Importing it imports neither TRL nor torch: the ``gem-core`` command reads it to add
``make-dataset trl``. TRL has no advantage registry and nothing in TRL is patched: ReBN comes with a
``GRPOTrainer`` subclass (:class:`gem_integrations.trl.advantage.GemGRPOTrainer`) that overrides TRL's
private ``_generate_and_score_completions``, so the versions it was read against are pinned here and
checked when the subclass is built (:meth:`~gem_core.plugins.TrainerPlugin.check_version`).
"""

from __future__ import annotations

from gem_core.plugins import TrainerPlugin

PLUGIN = TrainerPlugin(
    name="trl",
    distribution="trl",
    supported=">=1.16,<2",
    module="trl",
    estimators=("rebn",),
    dataset="gem_integrations.trl.dataset",
    experiment="gem_integrations.trl.experiment",
    description="TRL 1.16: a GRPOTrainer rollout_func over gem_core's runner and GemGRPOTrainer with rebn as (B, T) advantages",
)
