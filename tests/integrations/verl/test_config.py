"""hydra composes verl's own trainer config with the plugin's keys, and the estimator reads them."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_verl_config


def test_hydra_composes_plugin_keys(model_dir):
    from gem_integrations.verl.advantage import rebn_options

    cfg = compose_verl_config(model_dir, "+algorithm.rebn_group_by=uid", "algorithm.rebn_ddof=1", "algorithm.rebn_eps=1e-5")
    assert cfg.algorithm.adv_estimator == "rebn"
    assert cfg.trainer.use_v1 is True  # the trainer that stores per-turn rm_scores
    assert rebn_options(cfg.algorithm) == {"gamma": 0.9, "eps": 1e-5, "ddof": 1, "group_by": "uid"}


def test_plain_override_of_unknown_key_is_rejected_by_hydra(model_dir):
    """Without the leading '+' hydra refuses the key: what the README's '+algorithm.rebn_*' is for."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_verl_config(model_dir, "algorithm.rebn_gae=1")


def test_composed_config_drives_the_estimator(verl_config):
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
    out = compute_advantage(data, adv_estimator=verl_config.algorithm.adv_estimator, config=verl_config.algorithm)
    # returns: row 0 turns [0.9, 1.0] (rebn_gamma=0.9 from the composed config), row 1 one turn [1.0]
    assert out.batch["returns"][0, 0].item() == pytest.approx(0.9)
    assert out.batch["returns"][0, 2].item() == pytest.approx(1.0)
    assert out.batch["returns"][1, 0].item() == pytest.approx(1.0)


def _script_overrides(model_dir: str, data_dir: str) -> list[str]:
    """The hydra overrides examples/verl/run_gem_sudoku.sh passes to verl.trainer.main_ppo."""
    import shlex
    from pathlib import Path

    script = (Path(__file__).resolve().parents[3] / "examples" / "verl" / "run_gem_sudoku.sh").read_text()
    block = script.split("python -m verl.trainer.main_ppo", 1)[1].split('"$@"', 1)[0]
    return shlex.split(block.replace("\\\n", " ").replace("$MODEL", model_dir).replace("$DATA", data_dir))


def test_example_script_passes_verls_validate_config(model_dir, tmp_path):
    """The example's overrides, composed by hydra into verl's ppo_trainer config, pass verl's own
    validate_config (what main_ppo runs first) and the plugin's own check."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from gem_integrations.verl.advantage import check_trainer_config

    overrides = _script_overrides(model_dir, str(tmp_path))
    assert "algorithm.adv_estimator=rebn" in overrides
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    check_trainer_config(config)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "gem_env"
    assert config.trainer.use_v1 is True
