"""tests/serve: gem-core envs over OpenEnv 0.10.0's own server and GenericEnvClient (the `openenv` nox session).
Without the openenv package (the other sessions) nothing here is collected."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("openenv") is None:
    collect_ignore_glob = ["test_*.py"]
