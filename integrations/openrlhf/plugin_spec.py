"""The OpenRLHF plugin's descriptor for gem_core's plugin base (``gem_core.plugins`` entry point).

Importing it imports no OpenRLHF: the ``gem-core`` command reads it to add ``make-dataset openrlhf``
and ``gem-core openrlhf ...``.
"""

from __future__ import annotations

from gem_core.plugins import TrainerPlugin

PLUGIN = TrainerPlugin(
    name="openrlhf",
    distribution="openrlhf",
    supported=">=0.11,<0.12",
    module="openrlhf",
    estimators=("rebn",),
    dataset="gem_integrations.openrlhf.dataset",
    commands="gem_integrations.openrlhf.commands",
    description="OpenRLHF 0.11: the GEM agent file and the rebn advantage patch",
)
