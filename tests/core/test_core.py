"""Env/Wrapper basics: per-env RNG, state snapshots, spawn, live delegation."""

from __future__ import annotations

import random

import numpy as np
import pytest

import gem_core
from gem_core.core import Env, Wrapper


def test_reset_seeds_only_the_envs_own_rng():
    random.seed(123)
    np.random.seed(123)
    before = (random.random(), np.random.random())
    random.seed(123)
    np.random.seed(123)
    env = gem_core.make("game:GuessTheNumber-v0-hard")
    env.reset(seed=5)
    env.step(env.sample_random_action())
    assert (random.random(), np.random.random()) == before, "an env must not touch global RNG state"
    assert env.np_random_seed == 5


def test_two_envs_same_seed_same_stream_different_seed_differs():
    targets = {}
    for seed in range(20):
        env = gem_core.make("game:GuessTheNumber-v0-hard")
        env.reset(seed=seed)
        targets[seed] = env.unwrapped.target
        twin = gem_core.make("game:GuessTheNumber-v0-hard")
        twin.reset(seed=seed)
        assert twin.unwrapped.target == targets[seed]
    assert len(set(targets.values())) > 5


def test_state_snapshot_is_not_aliased():
    env = gem_core.make("game:GuessTheNumber-v0-hard")
    env.reset(seed=1)
    state = env.get_state()
    env.step("\\boxed{25}")
    env.set_state(state)
    env.step("\\boxed{25}")  # would be "already guessed" if the snapshot shared the set
    env.set_state(state)
    obs, *_ = env.step("\\boxed{25}")
    assert "already" not in obs


def test_spawn_same_state_and_fresh():
    env = gem_core.make("game:GuessTheNumber-v0-hard")
    env.reset(seed=3)
    group = env.spawn(4)
    assert all(g.unwrapped.target == env.unwrapped.target for g in group)
    assert all(g is not env for g in group)
    fresh = env.spawn(3, same_state=False, seeds=[3, 4, 5])
    assert fresh[0].unwrapped.target == env.unwrapped.target
    with pytest.raises(ValueError):
        env.spawn(-1)
    with pytest.raises(ValueError, match="seeds"):
        env.spawn(2, same_state=False, seeds=[1])


class _Tag(Wrapper):
    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        return obs + " [tagged]", r, te, tr, info


def test_wrapper_delegates_live_and_keeps_private_names_private():
    env = gem_core.make("game:GuessTheNumber-v0-hard", wrappers=[_Tag])
    env.reset(seed=0)
    env.unwrapped.max_number = 77  # changed after wrapping: seen through the wrapper
    assert env.max_number == 77
    assert env.unwrapped.spec.id == env.spec.id
    with pytest.raises(AttributeError):
        env._done  # private attributes are not forwarded
    assert env.step("\\boxed{1}")[0].endswith("[tagged]")
    clone = env.clone()
    assert isinstance(clone, _Tag) and clone.unwrapped is not env.unwrapped


def test_wrapper_rejects_non_env():
    with pytest.raises(TypeError, match="gem_core Env"):
        Wrapper(object())  # type: ignore[arg-type]


def test_env_without_reset_says_so():
    class NoReset(Env):
        pass

    with pytest.raises(NotImplementedError, match="reset"):
        NoReset().reset(seed=0)


def test_seed_generator_is_deterministic_distinct_and_reuses_the_object():
    from gem_core.core import seed_generator

    a, b = seed_generator(None, 42), seed_generator(None, 42)
    assert a.random(8).tolist() == b.random(8).tolist()
    first = {tuple(seed_generator(None, s).random(4).tolist()) for s in range(200)}
    assert len(first) == 200, "different seeds must give different streams"
    reused = seed_generator(a, 7)
    assert reused is a and reused.random(4).tolist() == seed_generator(None, 7).random(4).tolist()
    # seeds above 64 bits keep their high bits
    assert seed_generator(None, 1 << 70).random() != seed_generator(None, 0).random()


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_seed_generator_rejects_bad_seeds(bad):
    from gem_core.core import seed_generator

    with pytest.raises((TypeError, ValueError), match="seed must be"):
        seed_generator(None, bad)


def test_reset_with_a_bad_seed_is_a_clear_error():
    env = gem_core.make("game:GuessTheNumber-v0-easy")
    with pytest.raises(ValueError, match="non-negative"):
        env.reset(seed=-3)
