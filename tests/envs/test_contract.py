"""The Env contract, checked on every registered id (property tests).

For every id: arbitrary strings as actions never raise and always give a valid 5-tuple; episodes end
within the declared turn limit; reset(seed) is deterministic; get_state/set_state restores exactly;
oracle play wins (games).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gem_core
from gem_core.envs.games.base import TextGame
from gem_core.multimodal import MAX_IMAGE_SIDE, MAX_IMAGES, MultimodalObservation, observation_text
from gem_core.testing.task_data import generic_test_ids

# Built-in ids only: other test modules register throw-away envs, which must not leak in here.
ALL_IDS = generic_test_ids([i for i in gem_core.list_envs() if str(gem_core.spec(i).entry_point).startswith("gem_core.")])
GAME_IDS = [i for i in ALL_IDS if i.startswith("game:")]

# Text a model might plausibly produce: boxed fragments, numbers, coordinates, unicode, junk.
_fragments = st.sampled_from(
    [
        "\\boxed{",
        "}",
        "{",
        "\\boxed{}",
        "\\boxed{1}",
        "\\boxed{a}",
        "\\boxed{0 0}",
        "\\boxed{up}",
        "\\boxed{1 2 3}",
        "\\boxed{A1}",
        "\\boxed{reveal 1 1}",
        "\\boxed{-5}",
        "\\boxed{99999999999999999999}",
        "\\fbox{3}",
        " ",
        "\n",
        "\\boxed{[1, 2] [3, 4]}",
        "\\boxed{\\boxed{2}}",
        "\x00",
        "é",
        "🙂",
    ]
)
actions = st.one_of(st.text(max_size=60), st.lists(st.one_of(_fragments, st.text(max_size=8)), max_size=8).map("".join))


def _check_obs(obs) -> None:
    """Text, or text with a bounded number of bounded images (vision envs)."""
    assert isinstance(obs, (str, MultimodalObservation))
    if isinstance(obs, MultimodalObservation):
        assert len(obs.images) <= MAX_IMAGES and all(max(image.size) <= MAX_IMAGE_SIDE for image in obs.images)


def _check_step(result, max_turns: int, turn: int) -> bool:
    assert isinstance(result, tuple) and len(result) == 5
    obs, reward, terminated, truncated, info = result
    _check_obs(obs)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert not (terminated and truncated), "a time limit truncates; it does not also terminate"
    assert isinstance(info, dict)
    assert turn <= max_turns
    return terminated or truncated


@pytest.mark.parametrize("env_id", ALL_IDS)
@given(seed=st.integers(0, 2**31 - 1), script=st.lists(actions, min_size=1, max_size=12))
def test_arbitrary_actions_never_raise(env_id, seed, script):
    env = gem_core.make(env_id)
    obs, info = env.reset(seed=seed)
    _check_obs(obs)
    assert observation_text(obs) and isinstance(info, dict)
    max_turns = env.unwrapped.max_turns
    for turn in range(1, max_turns + 1):
        done = _check_step(env.step(script[(turn - 1) % len(script)]), max_turns, turn)
        if done:
            break
    else:
        pytest.fail(f"{env_id}: episode did not end within max_turns={max_turns}")


@pytest.mark.parametrize("env_id", ALL_IDS)
@given(seed=st.integers(0, 2**31 - 1))
@settings(max_examples=10)
def test_random_play_ends_within_limit(env_id, seed):
    env = gem_core.make(env_id)
    env.reset(seed=seed)
    max_turns = env.unwrapped.max_turns
    for turn in range(1, max_turns + 1):
        if _check_step(env.step(env.sample_random_action()), max_turns, turn):
            return
    pytest.fail(f"{env_id}: random play did not end within max_turns={max_turns}")


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_reset_is_deterministic(env_id):
    a, b = gem_core.make(env_id), gem_core.make(env_id)
    for seed in (0, 1, 12345):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b
        # The same random actions give the same episode.
        for _ in range(3):
            act = a.sample_random_action()
            assert act == b.sample_random_action()
            ra, rb = a.step(act), b.step(act)
            assert ra[:4] == rb[:4]
            if ra[2] or ra[3]:
                break


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_state_roundtrip_and_clone(env_id):
    env = gem_core.make(env_id)
    env.reset(seed=7)
    state = env.get_state()
    twins = env.spawn(2)
    act = env.sample_random_action()
    first = env.step(act)
    env.set_state(state)
    assert env.step(act)[:4] == first[:4], "set_state must restore the exact state, RNG included"
    for twin in twins:
        assert twin.step(act)[:4] == first[:4], "spawned copies must start from the same state"


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_step_after_end_is_a_clear_error(env_id):
    env = gem_core.make(env_id)
    env.reset(seed=3)
    env.step("no box here")  # a format error ends a game episode
    with pytest.raises(gem_core.ResetNeeded):
        env.step("\\boxed{1}")


@pytest.mark.parametrize("env_id", GAME_IDS)
@pytest.mark.parametrize("answer", ["I think the answer is 3", "My guess is \\boxed{}", "\\boxed{  }"])
def test_format_error_is_penalised_with_a_message(env_id, answer):
    """No box, or an empty one, is a format error (GEM's rule): an empty box as a free illegal move was a
    policy's way out of the penalty (seen in training: every turn ``\\boxed{}``, reward 0, never a guess)."""
    env = gem_core.make(env_id)
    env.reset(seed=5)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert reward == pytest.approx(-0.1)
    assert info["format_error"] is True and not info["invalid_action"]
    assert "\\boxed" in obs


@pytest.mark.parametrize("env_id", [i for i in GAME_IDS if not i.endswith("-v0")])
@pytest.mark.parametrize("seed", range(3))
def test_oracle_wins(env_id, seed):
    """Every game's oracle wins; for generated puzzles this proves the generator made a solvable one."""
    if "Game2048" in env_id:
        pytest.skip("2048 is stochastic; its own tests check the heuristic player")
    env = gem_core.make(env_id)
    env.reset(seed=seed)
    game = env.unwrapped
    assert isinstance(game, TextGame)
    total = 0.0
    for _ in range(game.max_turns):
        obs, reward, terminated, truncated, info = env.step(game.oracle_action())
        total += reward
        if terminated or truncated:
            break
    assert terminated and info["success"], f"{env_id} seed {seed}: oracle did not win: {obs}"
    assert reward > 0
