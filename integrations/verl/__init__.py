"""gem-core for verl 0.9: the ``rebn``/``gem_reinforce`` advantage estimators and the ``gem_env`` agent loop.

``pip install -e '.[verl]'`` is all a verl user needs: the ``verl.plugins`` entry point
(:mod:`gem_integrations.verl.plugin`) registers both in every process that imports verl. Then::

    python -m verl.trainer.main_ppo algorithm.adv_estimator=rebn +algorithm.rebn_gamma=0.9 \\
        actor_rollout_ref.rollout.multi_turn.enable=True data.train_files=train.parquet ...

with a parquet from ``gem-core make-dataset verl --env game:Sudoku-v0-easy --n 1024 --out train.parquet``
(its ``agent_name`` column selects the ``gem_env`` loop). The loop stores each token's turn id beside
``response_mask``, and the plugin's patch of verl's v1 ``PPOTrainer._compute_advantage`` hands them to
``rebn``, so verl's token-level rollout rejection never splits a turn (:mod:`.advantage`). The plugin is
described for gem_core's plugin base in :mod:`.plugin_spec` (``gem_core.plugins`` entry point). Nothing
here is imported by ``import gem_core``; importing this package imports nothing from verl until an
attribute below is used.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AGENT_NAME",
    "PLUGIN",
    "TURN_IDS_FIELD",
    "batch_turn_ids",
    "check_trainer_config",
    "GemAgentLoopOutput",
    "GemEnvAgentLoop",
    "VerlServerPolicy",
    "compute_gem_reinforce_advantage",
    "compute_rebn_advantage",
    "make_dataset",
    "register_estimators",
    "rebn_options",
]

_WHERE = {
    "AGENT_NAME": "rollout",
    "PLUGIN": "plugin_spec",
    "TURN_IDS_FIELD": "advantage",
    "batch_turn_ids": "advantage",
    "check_trainer_config": "advantage",
    "GemAgentLoopOutput": "rollout",
    "GemEnvAgentLoop": "rollout",
    "VerlServerPolicy": "rollout",
    "compute_gem_reinforce_advantage": "advantage",
    "compute_rebn_advantage": "advantage",
    "register_estimators": "advantage",
    "rebn_options": "advantage",
    "make_dataset": "dataset",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
