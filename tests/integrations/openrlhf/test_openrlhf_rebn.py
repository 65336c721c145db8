"""The rebn patch of OpenRLHF's RemoteExperienceMaker.compute_advantages_and_returns."""

from __future__ import annotations

import copy
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from conftest import samples_generator
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from gem_core.algo import rebn
from gem_core.testing.golden import GOLDEN_DDOF, GOLDEN_EPS, GOLDEN_GAMMA, GOLDEN_MAX_CONTEXT_TOKENS
from gem_integrations.openrlhf import advantage as patch

ORIGINAL = RemoteExperienceMaker.compute_advantages_and_returns
OTHER_ESTIMATORS = ["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce"]


@pytest.fixture(autouse=True)
def patched():
    patch.install()
    yield
    patch.uninstall()


def make_args(estimator="rebn", gamma=GOLDEN_GAMMA, n_samples=1, micro_batch_size=4, clip=(-10.0, 10.0)):
    return NS(
        algo=NS(advantage=NS(estimator=estimator, gamma=gamma, lambd=0.95, no_std_norm=False, rebn_eps=GOLDEN_EPS, rebn_ddof=GOLDEN_DDOF)),
        rollout=NS(n_samples_per_prompt=n_samples, micro_batch_size=micro_batch_size),
        reward=NS(clip_range=clip),
        train=NS(dynamic_batch_enable=False),
        data=NS(max_len=GOLDEN_MAX_CONTEXT_TOKENS),
    )


def make_maker(args, kl_coef=0.0, pad_token_id=0):
    maker = object.__new__(RemoteExperienceMaker)  # no Ray actor groups: only the advantage step runs
    maker.strategy = NS(args=args)
    maker.args = args
    maker.advantage_estimator = args.algo.advantage.estimator
    maker.kl_ctl = FixedKLController(kl_coef)
    maker.tokenizer = NS(pad_token_id=pad_token_id)
    return maker


def make_experiences(responses, maker, kl_seed=None):
    """OpenRLHF's own path: response -> Experience, micro-batches by split_rollout_samples, then the
    fields make_experience would add (kl, values, log-probs)."""
    generator = samples_generator()
    samples = [generator._process_response_into_experience(r, max_len=GOLDEN_MAX_CONTEXT_TOKENS) for r in responses]
    batches = maker.split_rollout_samples(samples)
    rng = torch.Generator().manual_seed(kl_seed or 0)
    for batch in batches:
        shape = batch.action_mask.shape
        if kl_seed is None:
            batch.kl = torch.zeros(shape)
        else:
            batch.kl = torch.rand(shape, generator=rng) * batch.action_mask
        batch.values = torch.rand(shape, generator=rng) * batch.action_mask
        batch.action_log_probs = torch.zeros(shape)
    return batches


def per_sample_advantages(batches):
    out = []
    for batch in batches:
        for row, mask in zip(batch.advantages, batch.action_mask):
            out.append((row, mask))
    return out


def test_patch_is_installed_and_idempotent():
    assert patch.is_active()
    method = RemoteExperienceMaker.compute_advantages_and_returns
    patch.install()
    assert RemoteExperienceMaker.compute_advantages_and_returns is method
    patch.uninstall()
    assert not patch.is_active() and RemoteExperienceMaker.compute_advantages_and_returns is ORIGINAL


def test_micro_batches_have_different_widths(responses):
    maker = make_maker(make_args())
    widths = {b.action_mask.shape[1] for b in make_experiences(responses, maker)}
    assert len(widths) == 2  # 6 samples in micro-batches of 4 and 2, padded differently


def test_rebn_gives_the_golden_token_advantages(golden, responses):
    maker = make_maker(make_args())
    batches = maker.compute_advantages_and_returns(make_experiences(responses, maker))
    rows = per_sample_advantages(batches)
    assert len(rows) == len(golden.sequences)
    for (advantages, mask), sequence, expected in zip(rows, golden.sequences, golden.token_advantages):
        start = len(sequence.prompt_ids) - 1  # action index of the first response token
        got = advantages[start : start + len(sequence.response_ids)].double().numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
        assert float(advantages[:start].abs().sum()) == 0.0
        assert float(advantages[start + len(sequence.response_ids) :].abs().sum()) == 0.0
    for batch in batches:
        assert batch.kl is None and not {"gem_turn_rewards", "gem_turn_spans"} & set(batch.info)


def test_rebn_returns_are_the_turn_returns(golden, responses):
    maker = make_maker(make_args())
    batches = maker.compute_advantages_and_returns(make_experiences(responses, maker))
    index = 0
    for batch in batches:
        for returns, mask in zip(batch.returns, batch.action_mask):
            sequence = golden.sequences[index]
            start = len(sequence.prompt_ids) - 1
            ends = [start + p for p in sequence.reward_positions]
            np.testing.assert_allclose(returns[ends].double().numpy(), golden.turn_returns[index], atol=1e-6)
            index += 1


def test_rebn_with_kl_penalty_counts_it_in_each_turn(golden, responses):
    kl_coef = 0.05
    maker = make_maker(make_args(), kl_coef=kl_coef)
    batches = make_experiences(responses, maker, kl_seed=7)
    kl_turn_sums = []
    for batch in batches:
        for kl in batch.kl:
            kl_turn_sums.append(kl.double())
    maker.compute_advantages_and_returns(batches)
    adjusted = []
    for trajectory, sequence, kl in zip(golden.trajectories, golden.sequences, kl_turn_sums):
        start = len(sequence.prompt_ids) - 1
        sums = []
        for t in range(trajectory.num_turns):
            tokens = [start + k for k, turn in enumerate(sequence.turn_ids) if turn == t and sequence.loss_mask[k]]
            sums.append(float(kl[tokens].sum()))
        adjusted.append([r - kl_coef * s for r, s in zip(trajectory.rewards, sums)])
    flat = np.asarray(rebn(adjusted, gamma=GOLDEN_GAMMA, ddof=GOLDEN_DDOF, eps=GOLDEN_EPS))
    rows = per_sample_advantages(batches)
    got = []
    for (advantages, _), sequence, trajectory in zip(rows, golden.sequences, golden.trajectories):
        start = len(sequence.prompt_ids) - 1
        got.extend(float(advantages[start + p]) for p in sequence.reward_positions)
    np.testing.assert_allclose(got, flat, atol=1e-5)
    no_kl = [a for a in np.concatenate([np.asarray(x) for x in golden.turn_advantages])]
    assert not np.allclose(got, no_kl, atol=1e-3)  # the KL term changed something


def test_rebn_with_overlong_penalty_moves_it_to_the_last_turn(golden, responses):
    args = make_args()
    args.reward.overlong_buffer_len = 100
    args.reward.overlong_penalty_factor = 1.0
    args.rollout.max_new_tokens = 300
    maker = make_maker(args)
    batches = make_experiences(responses, maker)
    totals_before = torch.cat([b.rewards.clone() for b in batches]).double()
    maker.compute_advantages_and_returns(batches)
    totals_after = torch.cat([b.rewards for b in batches]).double()
    penalties = (totals_after - totals_before).tolist()
    assert any(p < 0 for p in penalties)  # the long episodes were penalised by OpenRLHF's own code
    adjusted = [t.rewards[:-1] + [t.rewards[-1] + p] for t, p in zip(golden.trajectories, penalties)]
    flat = np.asarray(rebn(adjusted, gamma=GOLDEN_GAMMA, ddof=GOLDEN_DDOF, eps=GOLDEN_EPS))
    got = [float(adv[len(s.prompt_ids) - 1 + p]) for (adv, _), s in zip(per_sample_advantages(batches), golden.sequences) for p in s.reward_positions]
    np.testing.assert_allclose(got, flat, atol=1e-5)


def golden_rows(batches, golden):
    """Each sample's advantages over its response tokens, in golden order."""
    return [
        advantages[len(s.prompt_ids) - 1 : len(s.prompt_ids) - 1 + len(s.response_ids)].double().numpy()
        for (advantages, _), s in zip(per_sample_advantages(batches), golden.sequences)
    ]


def test_a_masked_token_inside_a_turn_changes_no_other_advantage(golden, responses):
    """The turns come from the runner (gem_turn_spans), not from the mask: zeroing one action token in
    the middle of a turn (as a trainer's token-level rejection does) leaves every other advantage as it was."""
    maker = make_maker(make_args())
    batches = make_experiences(responses, maker)
    sample = 1  # gtn-default, first micro-batch
    sequence = golden.sequences[sample]
    first_turn = [k for k, t in enumerate(sequence.turn_ids) if t == 0 and sequence.loss_mask[k]]
    rejected = len(sequence.prompt_ids) - 1 + first_turn[len(first_turn) // 2]
    assert bool(batches[0].action_mask[sample, rejected])
    batches[0].action_mask[sample, rejected] = False
    got = golden_rows(maker.compute_advantages_and_returns(batches), golden)
    for index, (row, expected) in enumerate(zip(got, golden.token_advantages)):
        keep = np.ones(len(expected), dtype=bool)
        if index == sample:
            keep[first_turn[len(first_turn) // 2]] = False
            assert row[~keep].tolist() == [0.0]
        np.testing.assert_allclose(row[keep], np.asarray(expected)[keep], atol=1e-5)


def test_mask_run_fallback_without_spans(golden, responses):
    """Without gem_turn_spans (another agent file), turns are the runs of the action mask: the same
    advantages while no token inside a turn is masked, and different ones once one is."""
    maker = make_maker(make_args())
    batches = make_experiences(responses, maker)
    for batch in batches:
        del batch.info["gem_turn_spans"]
    for row, expected in zip(golden_rows(maker.compute_advantages_and_returns(batches), golden), golden.token_advantages):
        np.testing.assert_allclose(row, expected, atol=1e-5)
    batches = make_experiences(responses, maker)
    for batch in batches:
        del batch.info["gem_turn_spans"]
    sequence = golden.sequences[1]
    first_turn = [k for k, t in enumerate(sequence.turn_ids) if t == 0 and sequence.loss_mask[k]]
    batches[0].action_mask[1, len(sequence.prompt_ids) - 1 + first_turn[len(first_turn) // 2]] = False
    with pytest.raises(ValueError, match="turns but only"):  # one turn split in two: more turns than rewards
        maker.compute_advantages_and_returns(batches)


def test_rebn_without_turn_rewards_fails_loudly(responses):
    maker = make_maker(make_args())
    batches = make_experiences(responses, maker)
    for batch in batches:
        del batch.info["gem_turn_rewards"]
    with pytest.raises(RuntimeError, match="gem_turn_rewards"):
        maker.compute_advantages_and_returns(batches)


def test_unpatched_openrlhf_rejects_rebn(responses):
    patch.uninstall()
    maker = make_maker(make_args())
    with pytest.raises(Exception, match="Unkown advantage_estimator rebn"):
        maker.compute_advantages_and_returns(make_experiences(responses, maker))


@pytest.mark.parametrize("estimator", OTHER_ESTIMATORS)
def test_other_estimators_are_unchanged(responses, estimator):
    n_samples = 2 if estimator in ("rloo", "reinforce_baseline", "group_norm", "dr_grpo") else 1
    args = make_args(estimator=estimator, gamma=0.97, n_samples=n_samples)
    maker = make_maker(args, kl_coef=0.02)
    rows = responses[: len(responses) // n_samples * n_samples]  # group estimators need whole groups
    batches = make_experiences(rows, maker, kl_seed=3)
    reference = copy.deepcopy(batches)
    for batch in reference:  # what OpenRLHF alone gets without the GEM turn fields
        batch.info.pop("gem_turn_rewards")
        batch.info.pop("gem_turn_spans")
        batch.info["gem/infra_failed_episodes"] = torch.zeros(len(batch.sequences))  # the patch's one addition
    expected = ORIGINAL(make_maker(copy.deepcopy(args), kl_coef=0.02), reference)
    got = maker.compute_advantages_and_returns(batches)
    assert patch.is_active()
    for want, have in zip(expected, got):
        torch.testing.assert_close(have.advantages, want.advantages, rtol=0, atol=0)
        torch.testing.assert_close(have.returns, want.returns, rtol=0, atol=0)
        assert set(have.info) == set(want.info)
        for key in want.info:
            torch.testing.assert_close(have.info[key], want.info[key], rtol=0, atol=0)


def test_the_patch_is_the_plugins_and_found_through_the_entry_point():
    from gem_core.plugins import TrainerPlugin, discover
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    assert isinstance(PLUGIN, TrainerPlugin) and discover()["openrlhf"] is PLUGIN
    assert PLUGIN.check_version() == "0.11.2" and PLUGIN.estimators == ("rebn",)
    assert PLUGIN.is_installed
    assert PLUGIN.uninstall() == [] and RemoteExperienceMaker.compute_advantages_and_returns is ORIGINAL


def test_the_setup_hook_patches_at_once_when_the_module_is_loaded():
    from gem_core.plugins import waiting_for_import
    from gem_integrations.openrlhf import plugin_spec

    patch.uninstall()
    plugin_spec.setup_worker()  # experience_maker is imported in this process: no import hook needed
    assert patch.is_active() and plugin_spec.armed()
    assert not waiting_for_import(plugin_spec.TARGET_MODULE)


def test_a_subprocess_patches_only_on_import_and_imports_nothing_heavy_at_hook_time(tmp_path):
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        "import sys, openrlhf_import_stubs as s\n"
        "s.install_then_arm()\n"
        "heavy = [m for m in ('deepspeed', 'vllm', 'torch', 'openrlhf.trainer.ppo_utils.experience_maker') if m in s.HOOK_MODULES]\n"
        "from gem_integrations.openrlhf import plugin_spec as p\n"
        "assert heavy == [] and p.armed(), heavy\n"
        "from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker\n"
        "from gem_core.plugins import waiting_for_import\n"
        "assert p.PLUGIN.is_installed and not waiting_for_import(p.TARGET_MODULE)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# -- infrastructure failures (DESIGN.md contract 8) ----------------------------------------------------


@pytest.fixture(scope="module")
def infra_failed_response(executor, tokenizer, golden):
    """A golden episode whose second request the engine aborted, through the agent file."""
    from conftest import faithful_engine, run_executor

    from gem_core.testing.golden import GOLDEN_PARAMS

    engine = faithful_engine(tokenizer)
    engine.aborted = {"req-2"}
    response, _ = run_executor(executor, tokenizer, golden.episodes[1], engine=engine, max_turn_tokens=GOLDEN_PARAMS.max_tokens)
    return response


@pytest.mark.parametrize("micro_batch_size", [4, 1])  # 1: a micro-batch holding only the failed episode
def test_an_infra_failed_episode_is_out_of_rebn_and_the_loss_and_counted(golden, responses, infra_failed_response, micro_batch_size):
    at = 2
    batch = [*responses[:at], infra_failed_response, *responses[at:]]
    maker = make_maker(make_args(micro_batch_size=micro_batch_size))
    batches = maker.compute_advantages_and_returns(make_experiences(batch, maker))
    rows = per_sample_advantages(batches)
    advantages, mask = rows.pop(at)
    assert int(mask.sum()) == 0 and float(advantages.abs().sum()) == 0.0  # no loss token, no advantage
    # The other episodes get exactly the golden advantages: ReBN over their turns alone.
    for (row, _), sequence, expected in zip(rows, golden.sequences, golden.token_advantages):
        start = len(sequence.prompt_ids) - 1
        np.testing.assert_allclose(row[start : start + len(sequence.response_ids)].double().numpy(), expected, rtol=0, atol=1e-5)
    counts = torch.cat([b.info["gem/infra_failed_episodes"] for b in batches])
    assert counts.tolist() == [1.0] * len(batch)  # the batch's count on every sample: OpenRLHF's mean logs it


def test_the_infra_count_is_added_for_every_estimator_and_zero_without_failures(responses):
    maker = make_maker(make_args(estimator="reinforce", gamma=1.0))
    batches = maker.compute_advantages_and_returns(make_experiences(responses, maker))
    assert torch.cat([b.info["gem/infra_failed_episodes"] for b in batches]).tolist() == [0.0] * len(responses)


def _fixed_kl_and_values(batches):
    """kl and values set by token position (right padding: the same on a sample's tokens whatever its
    micro-batch), so a batch with and one without the failed rows hold the same numbers per sample."""
    for batch in batches:
        columns = torch.arange(batch.action_mask.shape[1], dtype=torch.float32)
        batch.kl = (0.01 * (columns % 3)).expand_as(batch.action_mask) * batch.action_mask
        batch.values = (0.1 * (columns % 5)).expand_as(batch.action_mask) * batch.action_mask
    return batches


@pytest.mark.parametrize("estimator", OTHER_ESTIMATORS)
def test_infra_failed_rows_enter_no_baseline_of_openrlhfs_estimators(responses, infra_failed_response, estimator):
    """Two prompts of 4 samples, each with 3 played episodes and one the infrastructure failed, through
    OpenRLHF's own compute_advantages_and_returns as the plugin patches it: every played sample's
    advantages and returns equal what OpenRLHF gives the 6 played samples alone as groups of 3 (RLOO,
    group_norm, reinforce_baseline, dr_grpo: the group baseline; flash_reinforce: the batch mean; gae,
    reinforce: the whitening), with the same group_reward_std; the failed samples get 0; the count is
    logged."""
    played = responses[:6]
    batch = [*played[:3], infra_failed_response, *played[3:], infra_failed_response]
    args = make_args(estimator=estimator, gamma=1.0, n_samples=4)
    maker = make_maker(args, kl_coef=0.02)
    got = maker.compute_advantages_and_returns(_fixed_kl_and_values(make_experiences(batch, maker)))

    reference_args = make_args(estimator=estimator, gamma=1.0, n_samples=3)
    reference = _fixed_kl_and_values(make_experiences(played, make_maker(reference_args)))
    for experience in reference:
        experience.info.pop("gem_turn_rewards")
        experience.info.pop("gem_turn_spans")
    expected = ORIGINAL(make_maker(reference_args, kl_coef=0.02), reference)

    def per_sample(batches, name):
        return [(row, mask.bool()) for b in batches for row, mask in zip(getattr(b, name), b.action_mask)]

    failed_at = [3, 7]
    for name in ("advantages", "returns"):
        rows = per_sample(got, name)
        for at in failed_at:
            assert float(rows[at][0].abs().sum()) == 0.0 and int(rows[at][1].sum()) == 0
        healthy = [row for i, row in enumerate(rows) if i not in failed_at]
        for (have, mask), (want, want_mask) in zip(healthy, per_sample(expected, name)):
            assert torch.equal(mask, want_mask[: len(mask)]) or torch.equal(mask[: len(want_mask)], want_mask)
            torch.testing.assert_close(have[mask], want[want_mask], rtol=1e-6, atol=1e-6)
    if estimator in ("rloo", "reinforce_baseline", "group_norm", "dr_grpo"):
        stds = torch.cat([b.info["group_reward_std"] for b in got])
        healthy_stds = [float(v) for i, v in enumerate(stds) if i not in failed_at]
        assert healthy_stds == pytest.approx(torch.cat([b.info["group_reward_std"] for b in expected]).tolist(), abs=1e-6)
    assert torch.cat([b.info["gem/infra_failed_episodes"] for b in got]).tolist() == [2.0] * len(batch)


def test_a_group_left_with_one_played_episode_gets_no_advantage(responses, infra_failed_response):
    """rloo over a group of 2 whose other sample failed: nothing to compare with, 0 (OpenRLHF's own
    leave-one-out would divide by 0); the other group is OpenRLHF's."""
    batch = [responses[0], infra_failed_response, responses[1], responses[2]]
    maker = make_maker(make_args(estimator="rloo", gamma=1.0, n_samples=2))
    got = maker.compute_advantages_and_returns(_fixed_kl_and_values(make_experiences(batch, maker)))
    rows = [row for b in got for row in b.advantages]
    assert float(rows[0].abs().sum()) == 0.0 and float(rows[1].abs().sum()) == 0.0
    assert torch.isfinite(torch.cat([r.reshape(-1) for r in rows])).all()


def test_an_infra_failure_outside_the_launcher_warns_once(executor, tokenizer, golden, monkeypatch, caplog):
    """Plain ``openrlhf.cli.train_ppo_ray`` (no GEM_OPENRLHF_TURNS): the advantage patch is not armed, so
    OpenRLHF's group baselines would count the failed sample's 0: the agent file says so, once."""
    import logging

    from conftest import faithful_engine, run_executor

    from gem_core.testing.golden import GOLDEN_PARAMS
    from gem_integrations.openrlhf import rollout

    monkeypatch.delenv(rollout.TURNS_ENV, raising=False)
    monkeypatch.setattr(rollout, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger=rollout.__name__):
        for _ in range(2):
            engine = faithful_engine(tokenizer)
            engine.aborted = {"req-2"}
            response, _ = run_executor(executor, tokenizer, golden.episodes[1], engine=engine, max_turn_tokens=GOLDEN_PARAMS.max_tokens)
            assert response["extra_logs"][rollout.INFRA_FAILED_KEY] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "not started by `gem-core openrlhf train`" in r.getMessage()]
    assert len(warnings) == 1 and "rloo" in warnings[0]
