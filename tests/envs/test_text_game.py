"""TextGame's contract for game authors: play() returns a Move made by moved/illegal/won/lost, and
the shared loop turns it into the step's 5-tuple and info dict."""

from __future__ import annotations

import pytest

from gem_core.envs.games.base import TextGame, illegal, lost, moved, won


class Countdown(TextGame):
    """Say 'win', 'lose', 'bad' or 'step'; the turn limit pays 0.25 and adds a note."""

    def new_game(self) -> None:
        pass

    def instructions(self) -> str:
        return "Say a word."

    def play(self, move: str):
        if move == "win":
            return won("You won.", 1.0, {"extra": "w"})
        if move == "lose":
            return lost("You lost.", -0.5)
        if move == "bad":
            return illegal("Not allowed.", {"extra": "b"})
        return moved("Moved.", 0.1)

    def random_move(self) -> str:
        return "step"

    def oracle_move(self) -> str:
        return "win"

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        return observation + (" (last move illegal)" if invalid else ""), 0.25


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("\\boxed{win}", ("You won.", 1.0, True, False, {"success": True, "invalid_action": False, "extra": "w"})),
        ("\\boxed{lose}", ("You lost.", -0.5, True, False, {"success": False, "invalid_action": False})),
        ("\\boxed{bad}", ("Not allowed.", 0.0, False, False, {"success": False, "invalid_action": True, "extra": "b"})),
        ("\\boxed{step}", ("Moved.", 0.1, False, False, {"success": False, "invalid_action": False})),
    ],
)
def test_each_move_helper_reaches_the_step(action, expected):
    game = Countdown(max_turns=5)
    game.reset(seed=0)
    obs, reward, terminated, truncated, info = game.step(action)
    want_obs, want_reward, want_terminated, want_truncated, want_info = expected
    assert (obs, reward, terminated, truncated) == (want_obs, want_reward, want_terminated, want_truncated)
    assert isinstance(reward, float)
    assert info["turn"] == 1 and info["format_error"] is False
    assert {k: info[k] for k in want_info} == want_info
    assert "extra" in info or "extra" not in want_info


def test_the_turn_limit_hands_on_time_limit_the_last_move():
    game = Countdown(max_turns=2)
    game.reset(seed=0)
    game.step("\\boxed{step}")
    obs, reward, terminated, truncated, info = game.step("\\boxed{bad}")
    assert (terminated, truncated, reward) == (False, True, 0.25)
    assert obs == "Not allowed. You have reached the maximum number of turns. (last move illegal)"
    assert info["invalid_action"] is True


def test_reset_info_has_the_step_keys_and_the_turn_limit():
    game = Countdown(max_turns=3)
    _, reset_info = game.reset(seed=0)
    _, _, _, _, step_info = game.step("\\boxed{step}")
    assert set(reset_info) == set(step_info) | {"max_turns"} and reset_info["max_turns"] == 3
    assert set(step_info) == {"turn", "success", "invalid_action", "format_error", "suffix"}
    assert reset_info["turn"] == 0 and reset_info["suffix"] == "Enter your next move."


def test_random_helpers_stay_in_range_and_follow_the_seed():
    def draws(seed):
        game = Countdown(max_turns=3)
        game.reset(seed=seed)
        return [game._randbelow(7) for _ in range(200)], [game._randint(3, 5) for _ in range(200)]

    below, between = draws(1)
    assert set(below) == set(range(7)) and set(between) == {3, 4, 5}  # every value, none outside
    assert draws(1) == (below, between) and draws(2) != (below, between)
