"""``rebn`` / ``gem_reinforce`` through verl's own advantage dispatch (get_adv_estimator_fn and
ray_trainer.compute_advantage) on real DataProto batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from gem_core.algo import rebn

# DESIGN.md's golden values: episodes [[0,0,1],[0.5,-0.1],[0]], gamma 0.9
EPISODES = [[0.0, 0.0, 1.0], [0.5, -0.1], [0.0]]
RETURNS = [0.81, 0.9, 1.0, 0.41, -0.1, 0.0]
DDOF1 = [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615]
DDOF0 = [0.7085, 0.9164, 1.1474, -0.2156, -1.3939, -1.1628]


def _batch(episodes, turn_len=3, gap=2, width=20):
    """One row per episode: each turn `turn_len` model tokens, then `gap` env tokens; the reward on the
    turn's last model token. Returns (rewards, mask, [(row, slice) per turn])."""
    rewards = torch.zeros(len(episodes), width)
    mask = torch.zeros(len(episodes), width, dtype=torch.int64)
    spans = []
    for row, episode in enumerate(episodes):
        start = 0
        for reward in episode:
            mask[row, start : start + turn_len] = 1
            rewards[row, start + turn_len - 1] = reward
            spans.append((row, slice(start, start + turn_len)))
            start += turn_len + gap
    return rewards, mask, spans


def _data(rewards, mask, uids=None):
    from verl import DataProto

    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
    data.non_tensor_batch["uid"] = np.array(uids or [f"u{i}" for i in range(len(rewards))], dtype=object)
    return data


def _per_turn(values, spans):
    out = []
    for row, span in spans:
        turn = values[row, span]
        assert torch.allclose(turn, turn[0].expand_as(turn)), "one value on every token of a turn"
        out.append(float(turn[0]))
    return out


@pytest.mark.parametrize(("ddof", "expected"), [(1, DDOF1), (0, DDOF0)])
def test_compute_advantage_rebn_gives_design_golden_values(ddof, expected):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rewards, mask, spans = _batch(EPISODES)
    config = OmegaConf.create({"gamma": 1.0, "adv_estimator": "rebn", "rebn_gamma": 0.9, "rebn_ddof": ddof})
    data = compute_advantage(_data(rewards, mask), adv_estimator="rebn", gamma=1.0, config=config)
    assert _per_turn(data.batch["advantages"], spans) == pytest.approx(expected, abs=1e-4)
    assert _per_turn(data.batch["returns"], spans) == pytest.approx(RETURNS, abs=1e-6)
    assert float(data.batch["advantages"][mask == 0].abs().sum()) == 0.0  # env tokens and padding get nothing


def test_gamma_defaults_to_algorithm_gamma():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards, mask, spans = _batch(EPISODES)
    fn = get_adv_estimator_fn("rebn")
    _, returns = fn(token_level_rewards=rewards, response_mask=mask, config=OmegaConf.create({"gamma": 0.9}))
    assert _per_turn(returns, spans) == pytest.approx(RETURNS, abs=1e-6)
    _, undiscounted = fn(token_level_rewards=rewards, response_mask=mask, config=None)
    assert _per_turn(undiscounted, spans)[0] == pytest.approx(1.0)


def test_gem_reinforce_is_unnormalised_returns():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards, mask, spans = _batch(EPISODES)
    advantages, returns = get_adv_estimator_fn("gem_reinforce")(token_level_rewards=rewards, response_mask=mask, config=OmegaConf.create({"rebn_gamma": 0.9}))
    assert _per_turn(advantages, spans) == pytest.approx(RETURNS, abs=1e-6)
    assert torch.equal(advantages, returns)


def test_group_by_uid_normalises_per_prompt_group():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    episodes = [[0.0, 1.0], [1.0], [0.2, 0.0, 0.3], [0.5, 0.5]]
    uids = ["a", "a", "b", "b"]
    rewards, mask, spans = _batch(episodes)
    config = OmegaConf.create({"rebn_gamma": 0.9, "rebn_group_by": "uid"})
    data = compute_advantage(_data(rewards, mask, uids), adv_estimator="rebn", config=config)
    expected = np.asarray(rebn(episodes, gamma=0.9, group_by=uids, ddof=0, eps=1e-6))
    assert _per_turn(data.batch["advantages"], spans) == pytest.approx(expected.tolist(), abs=1e-6)
    whole = np.asarray(rebn(episodes, gamma=0.9, ddof=0, eps=1e-6))
    assert not np.allclose(expected, whole)  # grouping changes the answer, so the option is really used


def test_bad_options_are_refused():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards, mask, _ = _batch(EPISODES)
    with pytest.raises(ValueError, match="rebn_group_by"):
        get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config={"rebn_group_by": "env"})
    with pytest.raises(ValueError):
        get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config={"rebn_ddof": 5})


def test_v1_trainer_path_with_golden_scenario(golden):
    """The golden sequences, rewards on each turn's last token, through verl's v1 advantage wrapper."""
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    width = max(len(s.response_ids) for s in golden.sequences)
    rewards = torch.zeros(len(golden.sequences), width)
    mask = torch.zeros(len(golden.sequences), width, dtype=torch.int64)
    for i, sequence in enumerate(golden.sequences):
        rewards[i, : len(sequence.response_ids)] = torch.tensor(sequence.token_rewards())
        mask[i, : len(sequence.response_ids)] = torch.tensor(sequence.loss_mask)
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "adv_estimator": "rebn", "rebn_gamma": golden.gamma, "rebn_ddof": golden.ddof, "rebn_eps": golden.eps})
    data = compute_advantage_for_multi_trajectories(
        _data(rewards, mask), batch_keys=[f"u{i}_0_0" for i in range(len(rewards))], adv_estimator="rebn", config=config
    )
    for i, expected in enumerate(golden.token_advantages):
        np.testing.assert_allclose(data.batch["advantages"][i, : len(expected)].double().numpy(), expected, atol=1e-5)


def _golden_batch(golden):
    width = max(len(s.response_ids) for s in golden.sequences)
    n = len(golden.sequences)
    rewards, mask = torch.zeros(n, width), torch.zeros(n, width, dtype=torch.int64)
    turn_ids = torch.full((n, width), -1, dtype=torch.int64)
    for i, sequence in enumerate(golden.sequences):
        k = len(sequence.response_ids)
        rewards[i, :k] = torch.tensor(sequence.token_rewards())
        mask[i, :k] = torch.tensor(sequence.loss_mask)
        turn_ids[i, :k] = torch.tensor(sequence.turn_ids)
    return rewards, mask, turn_ids


def test_rejected_token_inside_a_turn_changes_no_other_advantage(golden):
    """verl's token-level rollout rejection zeroes one mask token inside a turn. With the turn ids the
    plugin hands verl's registered ``rebn`` (batch_turn_ids, as its _compute_advantage patch does), every
    other token's advantage is what it was without the rejection (the golden values); inferring turns from
    the mask instead would split the turn and change the whole batch."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from gem_integrations.verl.advantage import batch_turn_ids

    rewards, mask, turn_ids = _golden_batch(golden)
    config = OmegaConf.create({"rebn_gamma": golden.gamma, "rebn_ddof": golden.ddof, "rebn_eps": golden.eps})
    fn = get_adv_estimator_fn("rebn")
    row = 0  # a token in the middle of the first turn's response (neither its first nor its reward token)
    first_turn = (turn_ids[row] == 0) & (mask[row] == 1)
    position = int(first_turn.nonzero()[len(first_turn.nonzero()) // 2])
    assert 0 < position < int(first_turn.nonzero()[-1])
    rejected = mask.clone()
    rejected[row, position] = 0

    with batch_turn_ids(turn_ids):
        before, _ = fn(token_level_rewards=rewards, response_mask=mask, config=config)
        after, _ = fn(token_level_rewards=rewards, response_mask=rejected, config=config)
    keep = torch.ones_like(mask, dtype=torch.bool)
    keep[row, position] = False
    assert torch.equal(after[keep], before[keep])
    assert float(after[row, position]) == 0.0  # the rejected token itself is out of the loss
    for i, expected in enumerate(golden.token_advantages):
        np.testing.assert_allclose(before[i, : len(expected)].double().numpy(), expected, atol=1e-5)

    # the fallback (no turn ids): the rejection splits the turn and moves every advantage of the batch
    fallback, _ = fn(token_level_rewards=rewards, response_mask=rejected, config=config)
    assert not torch.allclose(fallback[keep], before[keep], atol=1e-4)


def test_turn_ids_of_the_wrong_shape_are_an_error(golden):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from gem_integrations.verl.advantage import batch_turn_ids

    rewards, mask, turn_ids = _golden_batch(golden)
    with batch_turn_ids(turn_ids[:, :-1]), pytest.raises(ValueError, match="turn ids of shape"):
        get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config=None)
    # an explicit argument works too, and equals the batch's
    explicit, _ = get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config=None, turn_ids=turn_ids)
    with batch_turn_ids(turn_ids):
        via_batch, _ = get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config=None)
    assert torch.equal(explicit, via_batch)


def test_padding_rows_copied_from_row_0_add_no_turns(golden):
    """verl's _balance_batch pads with copies of row 0 (tag is_padding, a one-token masked response, zero
    rewards) that keep row 0's gem_turn_ids. row_turn_ids gives them none, so rebn on the padded batch
    equals rebn on the real rows; taking the stored ids as they are would count row 0's turns again."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from gem_integrations.verl.advantage import batch_turn_ids, row_turn_ids

    rewards, mask, turn_ids = _golden_batch(golden)
    n, pads = len(golden.sequences), 3
    lengths = [len(s.response_ids) for s in golden.sequences]
    stored = [torch.tensor(s.turn_ids) for s in golden.sequences] + [torch.tensor(golden.sequences[0].turn_ids)] * pads
    padded_rewards = torch.cat([rewards, torch.zeros(pads, rewards.shape[1])])
    padded_mask = torch.cat([mask, torch.zeros(pads, mask.shape[1], dtype=mask.dtype)])
    config = OmegaConf.create({"rebn_gamma": golden.gamma, "rebn_ddof": golden.ddof, "rebn_eps": golden.eps})
    fn = get_adv_estimator_fn("rebn")

    ids, mismatched = row_turn_ids(stored, lengths + [1] * pads, [False] * n + [True] * pads)
    assert mismatched == 0 and bool((ids[n:] == -1).all()) and torch.equal(ids[:n], turn_ids)
    with batch_turn_ids(ids):
        advantages, _ = fn(token_level_rewards=padded_rewards, response_mask=padded_mask, config=config)
    for i, expected in enumerate(golden.token_advantages):
        np.testing.assert_allclose(advantages[i, : len(expected)].double().numpy(), expected, atol=1e-5)
    assert float(advantages[n:].abs().sum()) == 0.0

    # the stored ids as they are: every padding row adds row 0's turns with return 0 to the statistics
    copied = torch.cat([turn_ids, turn_ids[:1].expand(pads, -1)])
    with batch_turn_ids(copied):
        wrong, _ = fn(token_level_rewards=padded_rewards, response_mask=padded_mask, config=config)
    assert not torch.allclose(wrong[:n], advantages[:n], atol=1e-3)


def test_rows_whose_turn_ids_do_not_match_their_response_get_none():
    """An untagged row whose stored turn ids are not one per response token (a copy verl made without the
    padding tag) gets no turns and is counted; it can then carry no loss or reward without the estimator
    refusing the batch."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from gem_integrations.verl.advantage import batch_turn_ids, row_turn_ids

    ids, mismatched = row_turn_ids([[0, 0, 1], [0, 0, 1]], [3, 1], [False, False])
    assert mismatched == 1 and ids.tolist() == [[0, 0, 1], [-1, -1, -1]]
    with pytest.raises(ValueError, match="3 rows of turn ids"):
        row_turn_ids([[0], [0], [0]], [1, 1], [False, False])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    with batch_turn_ids(ids), pytest.raises(ValueError, match="turn id -1"):
        get_adv_estimator_fn("rebn")(token_level_rewards=rewards, response_mask=mask, config=None)


# ------------------------------------------------------------------------------------------------
# Infra-failed rows and verl's own estimators (DESIGN.md contract 8): out of every group's baseline.
# ------------------------------------------------------------------------------------------------

FAILED_KEY = "g0_3_0"  # the fourth sample of prompt g0: its sandbox died


def _infra_batch(estimator: str = "grpo"):
    """Two prompt groups as verl's v1 step holds them (keys ``{uid}_{session}_{index}``): g0's three
    solved episodes and one the infrastructure failed (mask 0, reward 0: the gem_env loop's row), g1's
    four healthy episodes with mixed rewards. Every field some registered estimator reads is there
    (``reward_baselines``, which verl's dispatch hands every estimator it finds in the batch, for remax only)."""
    from verl import DataProto

    generator = torch.Generator().manual_seed(0)
    lengths = [4, 6, 3, 5, 6, 2, 5, 4]
    scores = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.0]
    width, prompt = 6, 2
    mask = torch.zeros(8, width, dtype=torch.int64)
    rewards = torch.zeros(8, width)
    for row, (n, score) in enumerate(zip(lengths, scores)):
        mask[row, :n] = 1
        rewards[row, n - 1] = score
    mask[3] = 0  # the failed row keeps its tokens, but none carries loss (or reward)
    attention = torch.cat([torch.ones(8, prompt, dtype=torch.int64), mask.clone()], dim=1)
    attention[3, prompt : prompt + lengths[3]] = 1
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "values": torch.rand(8, width, generator=generator),
            "old_log_probs": -torch.rand(8, width, generator=generator),
            "sum_pi_squared": torch.rand(8, width, generator=generator),
            "prompts": torch.zeros(8, prompt, dtype=torch.int64),
            "attention_mask": attention,
        }
    )
    if estimator == "remax":
        data.batch["reward_baselines"] = torch.rand(8, generator=generator)
    data.non_tensor_batch["uid"] = np.array(["g0"] * 4 + ["g1"] * 4, dtype=object)
    data.non_tensor_batch["accuracy"] = np.array(scores, dtype=object)  # gdpo's reward component
    keys = [f"g{row // 4}_{row % 4}_0" for row in range(8)]
    return data, keys


def _registered_estimators():
    from verl.trainer.ppo import core_algos

    from gem_integrations.verl.advantage import register_estimators

    register_estimators()
    return sorted(core_algos.ADV_ESTIMATOR_REGISTRY)


@pytest.mark.parametrize("estimator", _registered_estimators())
def test_infra_failed_row_enters_no_baseline_of_any_registered_estimator(estimator):
    """Every estimator in verl's registry, through the v1 step's own estimator call as the plugin patches
    it: with the dead sandbox's key marked (what the _compute_advantage patch does from gem_infra_error),
    the three solved episodes of g0 and all of g1 get exactly what verl gives the batch without the failed
    row (GRPO: 0 for the solved, not +0.5; RLOO: 0, not +0.333), the failed row 0 advantage and return."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories as verls_own

    from gem_integrations.verl.advantage import failed_rows
    from gem_integrations.verl.plugin_spec import INFRA_PATCH

    assert INFRA_PATCH.applied  # the verl.plugins entry point installed it with the trainer module
    config = OmegaConf.create({"gamma": 1.0, "lam": 0.95, "adv_estimator": estimator, "norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": ["accuracy"]})
    step = {"adv_estimator": estimator, "gamma": 1.0, "lam": 0.95, "num_repeat": 4, "norm_adv_by_std_in_grpo": True, "config": config}
    data, keys = _infra_batch(estimator)
    healthy = [row for row, key in enumerate(keys) if key != FAILED_KEY]
    expected = verls_own(data.select_idxs(healthy), batch_keys=[keys[row] for row in healthy], **step)

    with failed_rows({FAILED_KEY}):
        out = trainer_base.compute_advantage_for_multi_trajectories(data, batch_keys=keys, **step)
    failed = keys.index(FAILED_KEY)
    for name in ("advantages", "returns"):
        assert out.batch[name][failed].abs().sum().item() == 0.0
        torch.testing.assert_close(out.batch[name][healthy], expected.batch[name], rtol=1e-6, atol=1e-6)
    if estimator in ("grpo", "rloo", "grpo_vectorized", "rloo_vectorized", "opo"):
        # the solved episodes of g0 are the group's mean: no signal, whatever the dead sandbox scored
        assert out.batch["advantages"][:3].abs().max().item() < 1e-5


def test_without_failures_the_step_is_verls_own():
    """No key marked: the patched call gives verl's own result, bit for bit (GRPO here)."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories as verls_own

    data, keys = _infra_batch()
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "adv_estimator": "grpo"})
    ours = trainer_base.compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo", config=config)
    theirs = verls_own(_infra_batch()[0], batch_keys=keys, adv_estimator="grpo", config=config)
    assert torch.equal(ours.batch["advantages"], theirs.batch["advantages"])
    assert ours.batch["advantages"][:3].abs().max().item() > 0.4  # the failed row's 0 in g0's baseline: verl's own rule


def test_every_row_failed_gives_zero_advantages():
    from verl.trainer.ppo.v1 import trainer_base

    from gem_integrations.verl.advantage import failed_rows

    data, keys = _infra_batch()
    with failed_rows(keys):
        out = trainer_base.compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo", config=OmegaConf.create({}))
    assert out.batch["advantages"].abs().sum().item() == 0.0 and out.batch["returns"].abs().sum().item() == 0.0


def test_grpo_passk_group_left_with_one_row_gets_zero_not_a_crash():
    """verl's grpo_passk refuses a uid group of one row; a group of 2 whose other sample's sandbox died
    gives its survivor 0 instead of stopping the step; the other group is verl's own result."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories as verls_own

    from gem_integrations.verl.advantage import failed_rows

    data, keys = _infra_batch("grpo_passk")
    data.non_tensor_batch["uid"] = np.array(["g0", "g0", "g1", "g1", "g2", "g2", "g2", "g2"], dtype=object)
    keys = ["g0_0_0", "g0_1_0", "g1_0_0", "g1_1_0", "g2_0_0", "g2_1_0", "g2_2_0", "g2_3_0"]
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0, "adv_estimator": "grpo_passk", "norm_adv_by_std_in_grpo": True})
    with failed_rows({"g1_1_0"}):  # row 3: g1 keeps row 2 alone
        out = trainer_base.compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo_passk", config=config)
    assert out.batch["advantages"][2:4].abs().sum().item() == 0.0
    rows = [0, 1, 4, 5, 6, 7]
    expected = verls_own(data.select_idxs(rows), batch_keys=[keys[i] for i in rows], adv_estimator="grpo_passk", config=config)
    torch.testing.assert_close(out.batch["advantages"][rows], expected.batch["advantages"])
