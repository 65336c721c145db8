"""The ``verl.plugins`` entry point: ``import verl`` alone registers everything, in a fresh process and in
a Ray worker; turning verl's plugin discovery off turns it off (so it is the entry point doing it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
print(json.dumps({
    "plugin_imported": "gem_integrations.verl.plugin" in sys.modules,
    "estimators": sorted(k for k in ("rebn", "gem_reinforce") if k in ADV_ESTIMATOR_REGISTRY),
    "agent_loop": _agent_loop_registry.get("gem_env"),
    "errors": getattr(sys.modules.get("gem_integrations.verl.plugin"), "ERRORS", None),
}))
"""


def _probe(**env):
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env={**os.environ, **env}, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("gem_core") == "gem_integrations.verl.plugin"


def test_fresh_process_import_verl_registers_everything():
    found = _probe()
    assert found == {
        "plugin_imported": True,
        "estimators": ["gem_reinforce", "rebn"],
        "agent_loop": {"_target_": "gem_integrations.verl.agent_loop.GemEnvAgentLoop"},
        "errors": {},
    }


def test_plugin_discovery_off_means_not_registered():
    found = _probe(VERL_USE_EXTERNAL_PLUGINS="none")
    assert found["plugin_imported"] is False
    assert found["estimators"] == [] and found["agent_loop"] is None


def test_ray_worker_gets_the_plugin():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:

        @ray.remote
        def probe():
            import os
            import sys

            import verl  # noqa: F401  (a fresh worker process: only the entry point can register)
            from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
            from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

            return os.getpid(), "rebn" in ADV_ESTIMATOR_REGISTRY, "gem_env" in _agent_loop_registry, "gem_integrations.verl.plugin" in sys.modules

        pid, has_rebn, has_loop, imported = ray.get(probe.remote(), timeout=240)
    finally:
        ray.shutdown()
    assert pid != os.getpid()
    assert (has_rebn, has_loop, imported) == (True, True, True)
