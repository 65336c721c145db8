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
