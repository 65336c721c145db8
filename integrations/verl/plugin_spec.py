"""The verl plugin's descriptor for gem_core's plugin base (``gem_core.plugins`` entry point).

Importing it imports no verl: the ``gem-core`` command reads it to add ``make-dataset verl``, and
:meth:`~gem_core.plugins.TrainerPlugin.check_version` tells a user which verl versions are tested.
"""

from __future__ import annotations

from gem_core.plugins import TrainerPlugin

PLUGIN = TrainerPlugin(
    name="verl",
    distribution="verl",
    supported=">=0.9,<0.10",
    module="verl",
    estimators=("rebn", "gem_reinforce"),
    dataset="gem_integrations.verl.dataset",
    description="verl 0.9: the gem_env agent loop and the rebn / gem_reinforce advantage estimators",
)
