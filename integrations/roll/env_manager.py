"""``env_manager_cls`` for ROLL: registers the ``gem-core`` env in the ``gem`` registry, then is ROLL's own manager.

    custom_envs:
      Sudoku:
        env_type: gem-core
        env_manager_cls: gem_integrations.roll.env_manager.StepConcatEnvManager
        history_length: 20          # >= max_steps: the rules and every earlier turn in each prompt

ROLL's ``EnvironmentWorker`` imports ``env_manager_cls`` by its dotted path
(``roll.utils.import_utils.safe_import_class``) in the process that then calls ``gem.make``; importing
this module there registers ``gem-core`` (:func:`gem_integrations.roll.rollout.register`, idempotent).
Looking a manager up imports ROLL and registers the ``llm_proxy`` ``gem_core_policy``
(:mod:`gem_integrations.roll.llm_proxy`). ``StepEnvManager``, ``StepConcatEnvManager``, ``TrajEnvManager`` and ``VLTrajEnvManager`` are ROLL's
classes themselves, looked up when asked for (the same objects, not subclasses: nothing of ROLL's
rollout changes). The step managers give ``step_reinforce`` its per-step samples; ``StepConcatEnvManager``
(ROLL's GEM view, ``examples/roll/``) shows the earlier observations, ``StepEnvManager`` only what its
``agent_template`` names (its ``{history}`` lists only invalid actions).
"""

from __future__ import annotations

import importlib
from typing import Any

from gem_integrations.roll.rollout import register

register()

MANAGERS = {
    "StepEnvManager": "roll.pipeline.agentic.env_manager.step_env_manager",
    "StepConcatEnvManager": "roll.pipeline.agentic.env_manager.step_concat_env_manager",
    "TrajEnvManager": "roll.pipeline.agentic.env_manager.traj_env_manager",
    "VLTrajEnvManager": "roll.pipeline.agentic.env_manager.vl_traj_env_manager",
}


def __getattr__(name: str) -> Any:
    if name not in MANAGERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (ROLL env managers here: {', '.join(MANAGERS)})")
    try:
        module = importlib.import_module(MANAGERS[name])
        importlib.import_module("gem_integrations.roll.llm_proxy")  # registers gem_core_policy before the manager makes its proxy
    except ImportError as exc:
        raise ImportError(f"{__name__}.{name} is ROLL's {MANAGERS[name]}.{name}, which does not import here: {exc}") from exc
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *MANAGERS])
