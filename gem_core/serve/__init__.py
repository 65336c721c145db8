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

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_ACTION_CHARS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_SESSIONS",
    "MAX_SESSIONS_LIMIT",
    "TOKEN_ENV",
    "OPENENV_VERSION",
    "OpenEnvUnavailable",
    "require_openenv",
    *_LAZY,
]

#: The openenv release this package is built and tested against (its server classes and client).
OPENENV_VERSION = "0.10.0"
#: The sessions one served id holds at once unless told otherwise (``--max-sessions``).
DEFAULT_MAX_SESSIONS = 64
#: The most sessions one id may be asked to hold (each has an env and a thread).
MAX_SESSIONS_LIMIT = 4096
#: Seconds a WebSocket session may go without a message before it is closed, env and sandbox with it.
DEFAULT_IDLE_TIMEOUT = 300.0
#: The longest action (characters) a step takes; a longer one is refused with one line, the session kept.
DEFAULT_MAX_ACTION_CHARS = 262_144
#: Open connections (WebSockets included) the server keeps; the next one is closed at once.
DEFAULT_MAX_CONNECTIONS = 512
#: Seconds a connection has to send a whole request's headers (and the WebSocket handshake).
DEFAULT_HEADER_TIMEOUT = 10.0
#: Seconds an HTTP request has to send its whole body.
DEFAULT_BODY_TIMEOUT = 30.0
#: The environment variable ``gem-core serve`` reads its token from when ``--token`` is not given.
TOKEN_ENV = "GEM_SERVE_TOKEN"


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
