"""The ROLL plugin's descriptor for gem_core's plugin base (the ``gem_core.plugins`` entry point).

ROLL is not installable from PyPI (its checkout is put on ``PYTHONPATH``), so the version checked is
that of what the bridge plugs into: gem-llm, the ``gem`` registry ROLL pins (``requirements_common.txt``:
``gem-llm==0.0.4``). :meth:`~gem_core.plugins.TrainerPlugin.install` checks it and registers the
``gem-core`` env (:func:`gem_integrations.roll.rollout.register`); no patch: ROLL's advantage code runs as
it is (``adv_estimator: step_reinforce``). Importing this module imports neither ROLL nor gem.
"""

from __future__ import annotations

from gem_core.plugins import TrainerPlugin


def _register() -> None:
    from gem_integrations.roll.rollout import register

    register()


PLUGIN = TrainerPlugin(
    name="roll",
    distribution="gem-llm",
    supported="==0.0.4",
    module="gem",
    register=_register,
    experiment="gem_integrations.roll.experiment",
    description="ROLL (alibaba/ROLL): any gem-core env as env_type gem-core in ROLL's agentic pipeline (gem-llm 0.0.4 registry); ReBN is ROLL's own step_reinforce + batch mean_std",
)
