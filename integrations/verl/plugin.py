"""The ``verl.plugins`` entry point of gem-core.

verl imports every entry point of the ``verl.plugins`` group at ``import verl`` (unless
``VERL_USE_EXTERNAL_PLUGINS=none``), in the driver and in every Ray worker, and swallows any error at
debug level. Importing this module installs the verl plugin (:data:`~.plugin_spec.PLUGIN`, through
gem_core's plugin base): the version check, the ``rebn``/``gem_reinforce`` estimators and the ``gem_env``
agent loop now; the trainer patches when verl's v1 trainer module is first imported (only verl's
driver imports it, and importing it here, inside ``verl/__init__``, would load the whole trainer stack
into every worker). :data:`LOADED` records what was registered and :data:`ERRORS` what failed (an
unsupported verl version included), since verl would hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gem_core.plugins import PluginError, when_imported

from .plugin_spec import PLUGIN, TRAINER_MODULE

LOADED: list[str] = []
ERRORS: dict[str, str] = {}


def _apply_patches(_module: Any = None) -> None:
    try:
        PLUGIN.install(check=False)  # registers again (idempotent) and applies the patches
        if "trainer_patches" not in LOADED:
            LOADED.append("trainer_patches")
    except Exception as exc:  # noqa: BLE001 - reported, never raised inside someone else's import
        ERRORS["trainer_patches"] = repr(exc)


def when_trainer_imported(callback: Callable[[Any], None]) -> None:
    """``callback(module)`` now if verl's v1 trainer module is loaded, else right after it is."""
    when_imported(TRAINER_MODULE, callback)


def load() -> list[str]:
    """Install the plugin (idempotent); returns the names registered. An unsupported verl version
    registers nothing and is recorded in :data:`ERRORS` with what to install."""
    try:
        PLUGIN.check_version()
    except PluginError as exc:
        ERRORS["version"] = str(exc)
        return []
    try:
        from .advantage import ESTIMATORS, register_estimators

        register_estimators()
        LOADED.extend(name for name in ESTIMATORS if name not in LOADED)
    except Exception as exc:  # keep the agent loop even if the estimators fail, and the reverse
        ERRORS["advantage"] = repr(exc)
    try:
        from .rollout import AGENT_NAME

        if AGENT_NAME not in LOADED:
            LOADED.append(AGENT_NAME)
    except Exception as exc:
        ERRORS["agent_loop"] = repr(exc)
    when_trainer_imported(_apply_patches)
    return [name for name in LOADED if name != "trainer_patches"]


load()
