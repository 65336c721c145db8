"""GuessTheNumber's hint-use metric, balanced seed sets and scripted baselines: parsed from the env's own
feedback messages, checked against episodes whose counts are worked out by hand."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

import gem_core
from gem_core.envs.games.guess_the_number import HintUse, balanced_seeds, baselines, episode_hint_use, hint_use, parse_feedback
from gem_core.rollout import Trajectory
from gem_core.rollout.trajectory import Turn


def _game(**kwargs):
    return gem_core.make("game:GuessTheNumber-v0-easy", **kwargs).unwrapped


def _target(game, seed: int) -> int:
    game.reset(seed=seed)
    return game.target


def _seed_with_target(game, target: int) -> int:
    return next(seed for seed in itertools.count() if _target(game, seed) == target)


def _feedback(game, seed: int, moves: list[str]) -> list[str]:
    """The env's own messages to ``moves`` (actions as the model writes them) in the episode of ``seed``."""
    game.reset(seed=seed)
    observations = []
    for move in moves:
        observation, _, terminated, truncated, _ = game.step(move)
        observations.append(observation)
        if terminated or truncated:
            break
    return observations


def test_every_feedback_message_is_parsed_to_the_number_it_names():
    game = _game()
    seed = _seed_with_target(game, 7)
    said = _feedback(game, seed, ["\\boxed{5}", "\\boxed{5}", "\\boxed{11}", "\\boxed{9}"])
    assert [parse_feedback(o) for o in said] == [(5, "higher"), (5, None), (11, None), (9, "lower")]
    assert parse_feedback(_feedback(game, seed, ["\\boxed{7}"])[0]) == (7, "correct")
    no_number = _feedback(game, seed, ["\\boxed{seven}", "I guess 4"])
    assert [parse_feedback(o) for o in no_number] == [(None, None), (None, None)]


def test_hint_use_of_hand_made_trajectories():
    """Three episodes on the env's real messages, counted by hand.

    A (target 7): 5 higher, 8 lower, 6 higher, 7 won. After a hint: 8, 6, 7 all inside the bounds (3 of 3);
    each moved the hinted way (3 of 3).
    B (target 3): 5 lower, 9 (above 5: outside the bounds, and moved up after "lower"), 9 again (a repeat:
    outside, not below 9), then no number. Consistent 0 of 2; right way 0 of 2.
    C (target 3): 11 (out of range: no hint), 4 lower, 2 higher, then 2 again (a repeat right after
    "higher": neither inside the bounds (2, 4) nor above 2). After a hint: 2 (inside), 2 (not): 1 of 2;
    right way: 2 after "lower" at 4 (yes), 2 after "higher" at 2 (no): 1 of 2.
    Total: consistent 4 of 7, right way 4 of 7; after "lower" 2 of 4 (A's 6, C's 2), after "higher" 2 of 3."""
    game = _game()
    seven, three = _seed_with_target(game, 7), _seed_with_target(game, 3)
    episodes = [
        _feedback(game, seven, ["\\boxed{5}", "\\boxed{8}", "\\boxed{6}", "\\boxed{7}"]),
        _feedback(game, three, ["\\boxed{5}", "\\boxed{9}", "\\boxed{9}", "no box"]),
        _feedback(game, three, ["\\boxed{11}", "\\boxed{4}", "\\boxed{2}", "\\boxed{2}"]),
    ]
    assert [len(e) for e in episodes] == [4, 4, 4]
    assert [episode_hint_use(e) for e in episodes] == [HintUse(3, 3, 3, 3, 1, 1), HintUse(2, 0, 2, 0, 2, 0), HintUse(2, 1, 2, 1, 1, 1)]
    total = hint_use(episodes)
    assert total == HintUse(guesses_after_hint=7, consistent=4, moves_after_hint=7, right_way=4, moves_after_lower=4, right_after_lower=2)
    assert total.consistent_rate == total.right_way_rate == pytest.approx(4 / 7)
    assert (total.right_after_lower_rate, total.right_after_higher_rate) == (0.5, pytest.approx(2 / 3))

    # the trainer's statistics read the same numbers off trajectories (each turn's observation)
    from gem_core.envs.report import EnvReport
    from gem_core.train.trainer import EpisodeStats

    trajectories = [
        Trajectory(episode_id=str(i), prompt_ids=[], turns=[Turn(j, 0, [], None, [], 0.0, False, False, observation=o) for j, o in enumerate(e)])
        for i, e in enumerate(episodes)
    ]
    stats = EpisodeStats.of(trajectories, EnvReport.of(game)).env_metrics  # through the env's report hook
    assert stats["hint_consistent_rate"] == stats["hint_right_way_rate"] == pytest.approx(4 / 7)
    assert (stats["hint_right_after_lower_rate"], stats["hint_right_after_higher_rate"]) == (0.5, pytest.approx(2 / 3))
    assert EpisodeStats.of(trajectories).env_metrics == {}  # not asked: not measured


def test_no_guess_after_a_hint_has_no_rate():
    assert hint_use([["At turn 1, your answer had no \\boxed{...} move."]]).consistent_rate is None
    assert hint_use([]).right_way_rate is None


@pytest.mark.parametrize("count, start", [(200, 1_000_000), (200, 1_500_000), (23, 0)])
def test_balanced_seeds_give_every_target_equally_often(count, start):
    game = _game()
    seeds = balanced_seeds(game, count, start)
    assert len(seeds) == len(set(seeds)) == count and min(seeds) >= start and seeds == sorted(seeds)
    targets = Counter(_target(game, s) for s in seeds)
    assert sorted(targets) == list(range(1, 11))
    assert max(targets.values()) - min(targets.values()) <= (count % 10 > 0)
    assert seeds == balanced_seeds(game, count, start)  # the same set every time


def test_a_range_drawn_per_episode_has_consecutive_seeds():
    game = gem_core.make("game:GuessTheNumber-v0-random").unwrapped
    assert balanced_seeds(game, 5, 10) == [10, 11, 12, 13, 14]


def test_the_baselines_are_the_scripted_players_exact_numbers():
    """On a balanced set of 1-10 in 4 turns: random guesses with repeats win 1 - 0.9^4; without repeats
    4/10 (the hint-blind ceiling); binary search every game, in 29/10 turns on average (1 turn for 5,
    2 for 2 and 8, 3 for 1, 3, 6, 9, 4 for 4, 7, 10). Binary search follows every hint."""
    game = _game()
    seeds = balanced_seeds(game, 10, 1_000_000)
    random_valid, blind, binary = baselines(game, seeds)
    assert random_valid.success_rate == pytest.approx(1 - 0.9**4)
    assert blind.success_rate == pytest.approx(0.4)
    assert (binary.success_rate, binary.turns_when_solved) == (1.0, pytest.approx(2.9))
    assert binary.hint_consistent_rate == binary.hint_right_way_rate == 1.0
    # a player that ignores the hints follows them only by chance, and more often without repeats
    assert 0.3 < random_valid.hint_consistent_rate < blind.hint_consistent_rate < 0.9
    assert 0.3 < blind.hint_right_way_rate < 1.0
    # 1-10 is symmetric (x -> 11 - x) and the set balanced: a random player is right as often after either hint
    assert blind.hint_right_after_lower_rate == pytest.approx(blind.hint_right_after_higher_rate)


def test_a_fixed_rising_sequence_is_caught_by_the_direction_after_lower():
    """The policy an exploratory run converged to plays 2, 3, 4, 5 whatever it is told. Most of its hints
    are "higher", so its pooled rates beat the random hint-blind player's; after "lower" it is never right."""
    game = _game()
    seeds = balanced_seeds(game, 10, 1_500_000)
    use = hint_use(_feedback(game, seed, ["\\boxed{2}", "\\boxed{3}", "\\boxed{4}", "\\boxed{5}"]) for seed in seeds)
    blind = baselines(game, seeds)[1]
    assert use.consistent_rate > blind.hint_consistent_rate and use.right_way_rate > blind.hint_right_way_rate
    assert (use.right_after_lower_rate, use.right_after_higher_rate) == (0.0, 1.0)
