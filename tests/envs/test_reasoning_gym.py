"""rg:* -- every reasoning-gym dataset as an env, scored by its own scorer: each resets and scores its
own oracle answer as correct; size/seed/config reach reasoning_gym.create_dataset."""

from __future__ import annotations

import pytest

rg = pytest.importorskip("reasoning_gym", reason="rg:* envs need the rg extra")

import gem_core  # noqa: E402
from gem_core.envs.reasoning_gym_env import RG_DATASETS  # noqa: E402
from gem_core.errors import InvalidArgumentError  # noqa: E402

#: Datasets whose items carry no reference answer (several answers are right and the item names none):
#: the test can only check that a wrong answer scores 0.
NO_ORACLE = {"boxnet", "rush_hour"}


def test_the_ids_are_the_packages_datasets():
    assert set(RG_DATASETS) == set(rg.factory.DATASETS) - {"composite"}
    assert {f"rg:{name}" for name in RG_DATASETS} <= set(gem_core.list_envs("rg"))


@pytest.mark.parametrize("name", RG_DATASETS)
def test_every_dataset_scores_its_own_oracle_answer(name):
    env = gem_core.make(f"rg:{name}", size=20)
    for seed in (0, 1):
        observation, info = env.reset(seed=seed)
        assert observation.endswith("\\boxed{}.") and info["idx"] == seed
        oracle = env.oracle_answer()
        if name in NO_ORACLE:
            assert oracle is None
            _obs, reward, terminated, _tr, info = env.step("\\boxed{no idea}")
            assert reward < 1.0 and terminated and not info["correct"]  # rush_hour gives 0.01 for a well-formed try
            continue
        _obs, reward, terminated, _tr, info = env.step("\\boxed{" + oracle + "}")
        assert (reward, terminated, info["correct"]) == (1.0, True, True), (name, oracle, info)


def test_size_seed_and_config():
    a = gem_core.make("rg:basic_arithmetic", size=3, seed=7)
    b = gem_core.make("rg:basic_arithmetic", size=3, seed=7)
    assert [a.reset()[0] for _ in range(4)] == [b.reset(seed=s)[0] for s in range(4)]
    assert a.reset(options={"idx": 0})[0] == b.reset(seed=0)[0]
    assert a.reset(seed=3)[1]["epoch"] == 1  # position 3 of size 3: the next epoch's dataset
    env = gem_core.make("rg:letter_counting", config={"min_words": 2, "max_words": 2})
    assert env._dataset(0).config.max_words == 2
    with pytest.raises(InvalidArgumentError, match="rg:letter_counting: config="):
        gem_core.make("rg:letter_counting", config={"no_such_option": 1})
    with pytest.raises(InvalidArgumentError, match="config"):
        gem_core.make("rg:letter_counting", config=[1])


def test_format_errors_and_huge_answers():
    env = gem_core.make("rg:letter_counting")
    env.reset(seed=0)
    _obs, reward, _t, _tr, info = env.step("6")
    assert reward == 0.0 and info["format_error"]
    env.reset(seed=0)
    _obs, reward, _t, _tr, info = env.step("\\boxed{" + "9" * 100_000 + "}")
    assert reward == 0.0 and "longer" in info["grading_error"]
