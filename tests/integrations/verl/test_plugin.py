"""The ``verl.plugins`` entry point: ``import verl`` alone registers everything, in a fresh process and in
a Ray worker; turning verl's plugin discovery off turns it off (so it is the entry point doing it). The
plugin goes through gem_core's plugin base: its descriptor is found through ``gem_core.plugins``, an
unsupported verl version is reported, and its trainer patches install when verl's trainer module loads
and uninstall exactly."""

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
    "trainer_imported": "verl.trainer.ppo.v1.trainer_base" in sys.modules,
}))
"""


def _probe(**env):
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env={**os.environ, **env}, check=True)
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
        "agent_loop": {"_target_": "gem_integrations.verl.rollout.GemEnvAgentLoop"},
        "errors": {},
        "trainer_imported": False,  # the trainer patches wait for verl's driver to import it
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


PATCH_PROBE = """
import json, sys
import verl
from verl.trainer.ppo.v1 import trainer_base
plugin = sys.modules["gem_integrations.verl.plugin"]
print(json.dumps({
    "errors": plugin.ERRORS,
    "loaded": plugin.LOADED,
    "compute_advantage": hasattr(trainer_base.PPOTrainer._compute_advantage, "__gem_core_patch__"),
    "init": hasattr(trainer_base.PPOTrainer.__init__, "__gem_core_patch__"),
    "infra": hasattr(trainer_base.compute_advantage_for_multi_trajectories, "__gem_core_patch__"),
}))
"""


def test_trainer_patches_install_when_verls_trainer_is_imported():
    result = subprocess.run([sys.executable, "-c", PATCH_PROBE], capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["errors"] == {}
    assert "trainer_patches" in found["loaded"]
    assert found["compute_advantage"] is True and found["init"] is True and found["infra"] is True


def test_descriptor_is_found_through_gem_core_plugins():
    from gem_core.plugins import discover

    plugin = discover()["verl"]
    assert plugin.distribution == "verl" and plugin.supported == ">=0.9,<0.10"
    assert plugin.estimators == ("rebn", "gem_reinforce")
    assert plugin.dataset == "gem_integrations.verl.dataset"
    assert plugin.check_version().startswith("0.9.")


def test_install_and_uninstall_revert_exactly():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from gem_integrations.verl.plugin_spec import PLUGIN

    PLUGIN.install()
    patched = (PPOTrainer.__dict__["_compute_advantage"], PPOTrainer.__dict__["__init__"])
    assert PLUGIN.is_installed
    assert PLUGIN.uninstall() == []
    assert not PLUGIN.is_installed
    originals = (PPOTrainer.__dict__["_compute_advantage"], PPOTrainer.__dict__["__init__"])
    assert all(hasattr(f, "__gem_core_patch__") for f in patched)
    assert not any(hasattr(f, "__gem_core_patch__") for f in originals)
    assert originals != patched
    PLUGIN.install()  # as the entry point left it, for the other tests
    assert PLUGIN.is_installed and PPOTrainer.__dict__["_compute_advantage"].__wrapped__ is originals[0]


def test_unsupported_verl_version_is_reported(monkeypatch):
    from gem_integrations.verl import plugin

    monkeypatch.setattr(plugin.PLUGIN, "supported", ">=0.10,<0.11")
    monkeypatch.setattr(plugin, "ERRORS", {})
    assert plugin.load() == []
    assert "verl 0.9" in plugin.ERRORS["version"] and "not supported" in plugin.ERRORS["version"]
    assert "verl>=0.10,<0.11" in plugin.ERRORS["version"]


def test_other_estimators_get_the_infra_failed_rows_marked_and_counted(model_dir, monkeypatch):
    """For grpo (any estimator not gem's) the _compute_advantage patch reads only gem_infra_error and
    gem_success from TransferQueue, counts the failed episodes in the step's metrics, marks their keys while
    verl's own step runs (no turn ids: those are the gem estimators') and logs the success rate of the
    episodes that finished (padding and failed rows left out)."""
    import transfer_queue
    from conftest import compose_verl_config
    from transfer_queue import KVBatchMeta

    from gem_integrations.verl import advantage

    asked = []

    def kv_batch_get(keys, partition_id, select_fields):
        asked.append(list(select_fields))
        reasons = {"g0_0_0": "", "g0_1_0": "the engine aborted the request", "g0_2_0": "", "pad_0_0": "the engine aborted the request"}
        outcomes = {"g0_0_0": 1.0, "g0_1_0": 0.0, "g0_2_0": 0.0, "pad_0_0": 1.0}
        fields = {"gem_infra_error": reasons, "gem_success": outcomes}
        return {name: [fields[name][key] for key in keys] for name in select_fields}  # non-tensor fields, as lists

    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv_batch_get)
    seen = []

    def original(self, batch, metrics):
        seen.append((advantage._FAILED_KEYS.get(), advantage._BATCH_TURN_IDS.get()))
        return batch

    class Trainer:
        config = compose_verl_config(model_dir, "algorithm.adv_estimator=grpo")

    keys = ["g0_0_0", "g0_1_0", "g0_2_0", "pad_0_0"]  # the last: verl's padding copy of a failed row 0
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{}, {}, {}, {"is_padding": True}])
    metrics: dict = {}
    assert advantage.wrap_compute_advantage(original)(Trainer(), batch, metrics) is batch
    assert seen == [(frozenset({"g0_1_0"}), None)] and asked == [["gem_infra_error"], ["gem_success"]]
    assert metrics["gem/infra_failed_episodes"] == 1.0 and metrics["gem/infra_failed_fraction"] == pytest.approx(1 / 3)
    assert metrics["gem/success_rate"] == pytest.approx(1 / 2)  # g0_0_0 of g0_0_0 and g0_2_0
    assert advantage._FAILED_KEYS.get() == frozenset()  # only while verl's step runs
