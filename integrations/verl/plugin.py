"""The ``verl.plugins`` entry point of gem-core.

verl imports every entry point of the ``verl.plugins`` group at ``import verl`` (unless
``VERL_USE_EXTERNAL_PLUGINS=none``), in the driver and in every Ray worker, and swallows any error at
debug level. Importing this module registers the ``rebn`` and ``gem_reinforce`` advantage estimators and
the ``gem_env`` agent loop. It runs while ``verl/__init__`` is still executing, after ``verl.protocol``
is loaded, which is all the modules imported here need. :data:`LOADED` records what was registered and
:data:`ERRORS` what failed, since verl would hide it.
"""

from __future__ import annotations

LOADED: list[str] = []
ERRORS: dict[str, str] = {}


def load() -> list[str]:
    """Register everything (idempotent); returns the names registered."""
    try:
        from .advantage import ESTIMATORS, register_estimators

        register_estimators()
        LOADED.extend(name for name in ESTIMATORS if name not in LOADED)
    except Exception as exc:  # keep the agent loop even if the estimators fail, and the reverse
        ERRORS["advantage"] = repr(exc)
    try:
        from .agent_loop import AGENT_NAME

        if AGENT_NAME not in LOADED:
            LOADED.append(AGENT_NAME)
    except Exception as exc:
        ERRORS["agent_loop"] = repr(exc)
    return list(LOADED)


load()
