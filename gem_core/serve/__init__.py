"""gem-core envs over OpenEnv's protocol, both ways (the ``openenv`` extra: ``pip install -e '.[openenv]'``).

* :func:`serve` / ``gem-core serve ENV_ID...``: any registered id served by OpenEnv's own server
  (``openenv.core.env_server.create_app``: HTTP and the ``/ws`` WebSocket sessions), one env per session,
  so OpenEnv's ``GenericEnvClient`` (and TRL, SkyRL, ... through it) plays gem-core envs.
* ``openenv:<url>``: an env on any OpenEnv server as a gem-core id (:class:`~gem_core.serve.remote.OpenEnvEnv`),
  so the runner, ``gem-core eval``, ``make-dataset`` and ReBN train on it.

``openenv`` is imported only inside this package, and only when one of these is used, so ``import
gem_core`` never needs it. Names are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from gem_core.errors import GemError

_LAZY = {
    "serve": "gem_core.serve.server",
    "build_app": "gem_core.serve.server",
    "EnvServer": "gem_core.serve.server",
    "GemEnvironment": "gem_core.serve.environment",
    "GemAction": "gem_core.serve.environment",
    "GemObservation": "gem_core.serve.environment",
    "GemState": "gem_core.serve.environment",
    "OpenEnvEnv": "gem_core.serve.remote",
}

__all__ = ["DEFAULT_MAX_SESSIONS", "MAX_SESSIONS_LIMIT", "OPENENV_VERSION", "OpenEnvUnavailable", "require_openenv", *_LAZY]

#: The openenv release this package is built and tested against (its server classes and client).
OPENENV_VERSION = "0.10.0"
#: The sessions one served id holds at once unless told otherwise (``--max-sessions``).
DEFAULT_MAX_SESSIONS = 64
#: The most sessions one id may be asked to hold (each has an env and a thread).
MAX_SESSIONS_LIMIT = 4096


class OpenEnvUnavailable(GemError, ImportError):
    """The ``openenv`` package is not installed (the ``openenv`` extra)."""


def require_openenv() -> None:
    """Import ``openenv``'s server and client modules, or raise one line naming the extra to install."""
    try:
        importlib.import_module("openenv.core.env_server")
        importlib.import_module("openenv.core.generic_client")
    except ImportError as err:
        raise OpenEnvUnavailable(f"serving and openenv: ids need the openenv package ({err}); install it with: pip install -e '.[openenv]'") from None


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gem_core.serve' has no attribute {name!r}")
    require_openenv()
    return getattr(importlib.import_module(module), name)
