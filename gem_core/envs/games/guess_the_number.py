"""Guess The Number: find a hidden integer from higher/lower hints."""

from __future__ import annotations

import math

from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import ECHO_CHARS, echo

_NUMBER = Param(int, low=-(10**9), high=10**9, none="a range drawn per episode")


class GuessTheNumber(TextGame):
    """Guess a number in ``[min_number, max_number]`` within ``max_turns`` guesses.

    Rewards: 1 for the right number; 0 for a hint; when the turns run out, a closeness reward
    ``1 - |guess - target| / (max - min)`` for the last valid guess (GEM's dense ending).
    ``min_number``/``max_number``/``max_turns`` all ``None`` draws a range per episode.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Guess The Number"

    params: ClassVar[dict[str, Param]] = {**TextGame.params, "min_number": _NUMBER, "max_number": _NUMBER}

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        low, high = args["min_number"], args["max_number"]
        if low is not None and high is not None and not low < high:
            raise invalid("max_number", high, f"an integer > min_number ({low})")

    def __init__(self, min_number: int | None = 1, max_number: int | None = 20, max_turns: int | None = 20):
        check_args(type(self), {"min_number": min_number, "max_number": max_number, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._random_range = min_number is None or max_number is None
        self._range_arg = (min_number, max_number)
        self.min_number = 1 if min_number is None else min_number
        self.max_number = 2 if max_number is None else max_number
        self.target = 0
        self.guessed: set[int] = set()
        self.last_guess: int | None = None

    def new_game(self) -> None:
        if self._random_range:
            self.min_number = self._randint(1, 10)
            self.max_number = self._randint(self.min_number + 5, self.min_number + 50)
        else:
            self.min_number, self.max_number = self._range_arg
        if self._max_turns_arg is None:
            self.max_turns = math.ceil(math.sqrt(self.max_number - self.min_number)) + 1
        self.target = self._randint(self.min_number, self.max_number)
        self.guessed = set()
        self.last_guess = None

    def instructions(self) -> str:
        return (
            f"You are playing Guess The Number.\n"
            f"Guess the number between {self.min_number} and {self.max_number} (inclusive) within {self.max_turns} turns.\n"
            "After each guess you are told whether the target is higher or lower.\n"
            f"Only the number inside \\boxed{{}} counts as your guess, for example \\boxed{{{self.min_number}}}.\n"
            "Enter your first guess to start the game."
        )

    def task_suffix(self) -> str:
        return "Enter your next guess."

    def play(self, move: str) -> Move:
        try:
            guess = int(move)
        except ValueError:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a whole number.")
        if guess < self.min_number or guess > self.max_number:
            shown = guess if len(move) <= ECHO_CHARS else echo(move)
            return illegal(f"At turn {self.turn}, you guessed {shown}, which is outside {self.min_number}-{self.max_number}.")
        guessed = self.guessed
        if guess in guessed:
            return illegal(f"At turn {self.turn}, you guessed {guess}, which you already guessed.")
        guessed.add(guess)
        self.last_guess = guess
        target = self.target
        if guess == target:
            return won(f"Congratulations! You guessed the correct number {target} in {self.turn} turns.", self.success_reward)
        hint = "lower" if guess > target else "higher"
        return moved(f"At turn {self.turn}, you guessed {guess}, and the target number is {hint} than {guess}.")

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        if self.last_guess is not None and not invalid:
            reward = 1.0 - abs(self.last_guess - self.target) / (self.max_number - self.min_number)
        return observation, reward

    def random_move(self) -> str:
        return str(self._randint(self.min_number, self.max_number))

    def oracle_move(self) -> str:
        """Binary search over what the hints allow: wins within ceil(log2(range + 1)) turns.
        The bounds are worked out here from the guesses (not kept up to date in ``play``, the hot path)."""
        target = self.target
        low = max((g + 1 for g in self.guessed if g < target), default=self.min_number)
        high = min((g - 1 for g in self.guessed if g > target), default=self.max_number)
        return str((low + high) // 2)
