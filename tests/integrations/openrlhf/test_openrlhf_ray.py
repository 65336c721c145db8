"""End to end in a local Ray cluster started with the plugin's runtime env (its worker setup hook):
OpenRLHF's real agent loader and generate_responses in a rollout actor, OpenRLHF's real
_process_response_into_experience, then split_rollout_samples and the patched
compute_advantages_and_returns in a trainer actor; compared with the core reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import label_of, openrlhf_params, samples_generator

from gem_core.testing.golden import GOLDEN_DDOF, GOLDEN_EPS, GOLDEN_GAMMA, GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS

ray = pytest.importorskip("ray")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_rollout_actor_to_patched_advantages_equal_the_core_reference(cluster, golden, tokenizer):
    from gem_integrations.openrlhf import agent_path
    from gem_integrations.openrlhf.train_ppo_ray import check_patch_active

    from ray_actors import CPURolloutActor, TrainerActor

    rollout = ray.remote(num_cpus=1)(CPURolloutActor).remote(agent_path())
    trainer = ray.remote(num_cpus=1)(TrainerActor).remote()
    check_patch_active()  # the launcher's own check passes in this cluster

    # What OpenRLHF's samples generator dispatches: one generate_responses per prompt, all in flight.
    refs = [
        rollout.generate_responses.remote(
            prompt=f"(row of {episode.episode_id})",
            label=label_of(episode, max_turn_tokens=GOLDEN_PARAMS.max_tokens),
            sampling_params=openrlhf_params(),
            max_length=GOLDEN_MAX_CONTEXT_TOKENS,
            hf_tokenizer=tokenizer,
            num_samples=1,
        )
        for episode in golden.episodes
    ]
    responses = [r for ref in refs for r in ray.get(ref, timeout=300)]
    generator = samples_generator()
    samples = [generator._process_response_into_experience(r, max_len=GOLDEN_MAX_CONTEXT_TOKENS) for r in responses]

    before = ray.get(trainer.modules.remote(), timeout=120)
    result = ray.get(trainer.advantages.remote(samples, GOLDEN_GAMMA, GOLDEN_EPS, GOLDEN_DDOF, 4), timeout=120)
    rollout_modules = ray.get(rollout.modules.remote(), timeout=60)

    # The setup hook imported nothing heavy anywhere; the patch was armed, and applied only where
    # OpenRLHF's experience maker was imported (the trainer), never in the rollout (vLLM) actor.
    for report in (before, rollout_modules["at_start"], rollout_modules["now"]):
        assert report["hook_loaded"] == [] and report["armed"]
    assert not before["target_loaded"] and result["patched"]
    assert not rollout_modules["now"]["target_loaded"] and "deepspeed" not in rollout_modules["now"]["loaded_now"]

    assert "gem_turn_rewards" not in result["info_keys"] and "gem_turn_spans" not in result["info_keys"]
    for index, (sequence, expected) in enumerate(zip(golden.sequences, golden.token_advantages)):
        assert responses[index]["observation_tokens"] == sequence.prompt_ids + sequence.response_ids
        start = len(sequence.prompt_ids) - 1  # OpenRLHF's action axis is shifted by one
        stop = start + len(sequence.response_ids)
        assert result["action_mask"][index][start:stop] == sequence.loss_mask
        row = np.asarray(result["advantages"][index])
        np.testing.assert_allclose(row[start:stop], expected, atol=1e-5)
        assert not row[:start].any() and not row[stop:].any()
        returns = np.asarray(result["returns"][index])
        np.testing.assert_allclose(returns[[start + p for p in sequence.reward_positions]], golden.turn_returns[index], atol=1e-6)
