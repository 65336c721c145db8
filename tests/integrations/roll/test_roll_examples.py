"""examples/roll/gem_core_rebn.yaml: the ReBN keys ROLL reads and envs that the bridge makes."""

from __future__ import annotations

from pathlib import Path

import gem
import numpy as np
import pytest

from gem_core.algo import rebn
from gem_integrations.roll import ROLL_REBN, rebn_settings
from gem_integrations.roll.rollout import ENV_TYPE
from gem_integrations.roll.plugin_spec import PLUGIN

yaml = pytest.importorskip("yaml")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "roll" / "gem_core_rebn.yaml"


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load(EXAMPLE.read_text())


def test_rebn_keys(config):
    assert config["adv_estimator"] == "step_reinforce"
    assert config["reward_normalization"] == {"grouping": "batch", "method": "mean_std"}
    assert config["gamma"] == 1.0 and config["whiten_advantages"] is False and config["add_token_level_kl"] is False
    assert config["advantage_clip"] >= 1e9 and "reward_clip" not in config  # no ReBN |A| reaches it; no reward clip
    assert config["batch_adjust_mode"] == "delete"  # copy would train copies and count them in the mean and std
    settings = rebn_settings(config["step_reward_gamma"])
    assert settings == {"gamma": config["step_reward_gamma"], "group_by": None, **ROLL_REBN}
    out = np.asarray(rebn([[0, 0, 1], [0.5, -0.1], [0]], **rebn_settings(0.9)))
    np.testing.assert_allclose(out, [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615], atol=5e-5)


def test_no_top_level_key_is_null(config):
    # ROLL loads its config with dacite into typed dataclass fields (reward_clip: float...): a null is refused
    assert not [key for key, value in config.items() if value is None]


def test_every_custom_env_is_made_by_the_bridge(config):
    assert config["custom_envs"]
    for tag, env in config["custom_envs"].items():
        assert env["env_type"] == ENV_TYPE, tag
        assert env["env_manager_cls"].startswith("gem_integrations.roll.env_manager.Step"), tag  # per-step samples
        made = gem.make(env_id=env["env_type"], **env["env_config"])  # ROLL's call
        observation, info = made.reset(seed=0)
        assert observation and info["env_instruction"] == ""
        made.close()


def test_plugin_descriptor_checks_roll_s_gem_pin_and_registers():
    assert PLUGIN.check_version() == "0.0.4"
    PLUGIN.install()
    assert ENV_TYPE in gem.envs.registration.ENV_REGISTRY
