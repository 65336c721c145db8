"""The golden scenario through the ROLL bridge, played the way ROLL's env managers play it (gem.make(env_id=...),
reset(seed=...), step(action=<the response decoded with special tokens>), stop on terminated), equals the
core reference: rewards, what the model is shown, where each episode ends, and ReBN with ROLL's settings."""

from __future__ import annotations

import gem
import numpy as np

from gem_core.algo import rebn
from gem_integrations.roll import rebn_settings
from gem_integrations.roll.rollout import ENV_TYPE


def play_like_roll(episode, trajectory, tokenizer, max_steps=100):
    env = gem.make(env_id=ENV_TYPE, env=episode.env_id, env_kwargs=dict(episode.env_kwargs), tools=list(episode.tools))
    try:
        observation, info = env.reset(seed=episode.seed)
        shown, rewards, ends = [observation], [], []
        for step, turn in enumerate(trajectory.turns, start=1):
            action = tokenizer.decode(turn.response_ids, skip_special_tokens=False)  # ROLL's batch_decode
            observation, reward, terminated, truncated, info = env.step(action=action)
            rewards.append(reward)
            shown.append(observation)
            ends.append(bool(terminated) or step >= max_steps)
            if ends[-1]:
                break
        return shown, rewards, ends, info
    finally:
        env.close()


def test_golden_scenario_through_the_bridge(golden_roll, tokenizer):
    scenario = golden_roll
    assert any(e.tools for e in scenario.episodes), "the tool episode is part of the scenario"
    all_rewards = []
    for episode, trajectory in zip(scenario.episodes, scenario.trajectories):
        shown, rewards, ends, _ = play_like_roll(episode, trajectory, tokenizer)
        first = tokenizer.decode(trajectory.prompt_ids, skip_special_tokens=False)
        assert shown[0] in first, episode.episode_id  # the first message is the reference's prompt
        assert rewards == trajectory.rewards, episode.episode_id
        for turn, message in zip(trajectory.turns, shown[1:]):
            cut = trajectory.truncation_reason == "context_limit" and turn is trajectory.turns[-1]
            if not cut:  # the runner's context limit: that observation was never shown
                assert message == turn.message, (episode.episode_id, turn.index)
        if trajectory.terminated or trajectory.truncation_reason not in (None, "context_limit"):
            assert ends[-1] and not any(ends[:-1]), episode.episode_id  # ROLL ends it where the core did
        else:  # the runner's context limit: ROLL stops on its own sequence_length, not the env
            assert not any(ends), episode.episode_id
        all_rewards.append(rewards)
    roll = np.asarray(rebn(all_rewards, **rebn_settings(scenario.gamma)), dtype=np.float64)
    reference = np.concatenate([np.asarray(a, dtype=np.float64) for a in scenario.turn_advantages])
    np.testing.assert_allclose(roll, reference, rtol=0, atol=1e-12)
