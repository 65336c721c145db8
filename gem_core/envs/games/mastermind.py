"""Mastermind: crack a hidden code of digits from black/white peg feedback."""

from __future__ import annotations

import itertools
from operator import eq
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import echo

# (code_length, num_numbers, max_turns) settings that the random variant draws from (GEM's table).
RANDOM_SETTINGS: tuple[tuple[int, int, int], ...] = ((2, 4, 10), (4, 6, 20), (4, 8, 30))

# The oracle scores at most this many of the still-possible codes as its next guess (minimax over
# their feedback partitions); more would only cost time without winning noticeably sooner.
_ORACLE_GUESS_POOL = 200
_ORACLE_CELLS = 20_000_000


def score_guess(secret: Sequence[int], guess: Sequence[int]) -> tuple[int, int]:
    """Peg feedback ``(black, white)``: black = right digit in the right place; white = a digit of
    the code that is in the guess at another place, each code digit counted at most once."""
    black = sum(map(eq, secret, guess))
    unmatched = list(secret)
    common = 0  # digits shared by both, with multiplicity: each code digit pairs with one guess digit
    for digit in guess:
        if digit in unmatched:
            unmatched.remove(digit)
            common += 1
    return black, common - black


@lru_cache(maxsize=None)
def _digit_values(num_numbers: int) -> dict[str, int]:
    """``{"1": 1, ..., str(num_numbers): num_numbers}``: reads and range-checks a digit in one lookup."""
    return {str(d): d for d in range(1, num_numbers + 1)}


@lru_cache(maxsize=8)
def _all_codes(code_length: int, num_numbers: int, duplicates: bool) -> np.ndarray:
    """Every possible code as rows of an int8 array (read-only, shared by all games)."""
    digits = range(1, num_numbers + 1)
    source = itertools.product(digits, repeat=code_length) if duplicates else itertools.permutations(digits, code_length)
    codes = np.array(list(source), dtype=np.int8).reshape(-1, code_length)
    codes.flags.writeable = False
    return codes


def _feedback_keys(codes: np.ndarray, code_counts: np.ndarray, guess: np.ndarray, num_numbers: int) -> np.ndarray:
    """For every row of ``codes`` as the secret, the feedback to ``guess`` as one int: black * (L + 1) + white."""
    black = (codes == guess).sum(axis=1)
    guess_counts = np.bincount(guess, minlength=num_numbers + 1)
    white = np.minimum(code_counts, guess_counts).sum(axis=1) - black
    return black * (codes.shape[1] + 1) + white


def _digit_counts(codes: np.ndarray, num_numbers: int) -> np.ndarray:
    """How often each digit 0..num_numbers occurs in each code (one row per code, int8)."""
    return np.stack([(codes == d).sum(axis=1, dtype=np.int8) for d in range(num_numbers + 1)], axis=1)


class Mastermind(TextGame):
    """Guess a secret code of ``code_length`` digits from 1 to ``num_numbers`` within ``max_turns``.

    Each valid guess is answered with black pegs (right digit, right place) and white pegs (right
    digit, wrong place). Rewards follow GEM's dense scheme: when a guess beats the best black-peg
    count so far, it earns the gain divided by ``code_length``, so the rewards of a solved game add
    up to 1; other valid guesses earn 0, as do invalid ones (wrong length, digits out of range, a
    repeated guess). ``None`` for ``code_length``, ``num_numbers`` or ``max_turns`` draws a setting
    from :data:`RANDOM_SETTINGS` per episode (explicit values still win); ``duplicate_numbers=None``
    draws whether the code may repeat digits.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Mastermind"

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "code_length": Param(int, low=1, high=10, none="drawn per episode"),
        "num_numbers": Param(int, low=1, high=20, none="drawn per episode"),
        "duplicate_numbers": Param(bool, none="drawn per episode"),
    }

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        length, numbers = args["code_length"], args["num_numbers"]
        if length and numbers and args["duplicate_numbers"] is False and length > numbers:
            raise invalid(
                "num_numbers",
                numbers,
                f"an integer >= code_length ({length}) for a code of distinct digits (or pass duplicate_numbers=True)",
            )

    def __init__(
        self,
        code_length: int | None = 4,
        num_numbers: int | None = 6,
        max_turns: int | None = 20,
        duplicate_numbers: bool | None = False,
    ):
        check_args(
            type(self),
            {"code_length": code_length, "num_numbers": num_numbers, "max_turns": max_turns, "duplicate_numbers": duplicate_numbers},
            type(self).__name__,
        )
        super().__init__(max_turns)
        self._random_setting = code_length is None or num_numbers is None or max_turns is None
        self._size_args = (code_length, num_numbers, duplicate_numbers)
        self.code_length = code_length or 1
        self.num_numbers = num_numbers or 1
        self.duplicate_numbers = bool(duplicate_numbers)
        self.secret: tuple[int, ...] = ()
        self.history: list[tuple[tuple[int, ...], int, int]] = []  # (guess, black, white)
        self.guessed: set[tuple[int, ...]] = set()
        self.best_black = 0

    # -- game ------------------------------------------------------------------------------------
    def new_game(self) -> None:
        code_length, num_numbers, duplicates = self._size_args
        if self._random_setting:
            drawn_length, drawn_numbers, drawn_turns = RANDOM_SETTINGS[self._randint(0, len(RANDOM_SETTINGS) - 1)]
            code_length = code_length or drawn_length
            num_numbers = num_numbers or drawn_numbers
            if self._max_turns_arg is None:
                self.max_turns = drawn_turns
        if duplicates is None:
            duplicates = bool(self._randint(0, 1))
        if not duplicates and code_length > num_numbers:
            duplicates = True  # only reachable by mixing a fixed length with a drawn range
        self.code_length, self.num_numbers, self.duplicate_numbers = code_length, num_numbers, duplicates
        self.secret = self._draw_code()
        self.history = []
        self.guessed = set()
        self.best_black = 0

    def _draw_code(self) -> tuple[int, ...]:
        # One batch of uniforms and a partial Fisher-Yates shuffle in Python: several times faster
        # than Generator.choice/permutation for codes this short.
        n = self.num_numbers
        uniforms = self.np_random.random(self.code_length).tolist()
        if self.duplicate_numbers:
            return tuple(int(u * n) + 1 for u in uniforms)
        pool = list(range(1, n + 1))
        for k, u in enumerate(uniforms):
            j = k + int(u * (n - k))
            pool[k], pool[j] = pool[j], pool[k]
        return tuple(pool[: self.code_length])

    def _example(self) -> str:
        return " ".join(str(d % self.num_numbers + 1) for d in range(self.code_length))

    def instructions(self) -> str:
        repeats = "may repeat" if self.duplicate_numbers else "are all different"
        return (
            "You are playing Mastermind.\n"
            f"A secret code of {self.code_length} digits is hidden. Each digit is between 1 and {self.num_numbers} "
            f"(inclusive), and the digits of the code {repeats}. Crack it within {self.max_turns} turns.\n"
            "Every guess is scored with pegs: a black peg for each digit that is right and in the right position, "
            "and a white peg for each further digit of the code that your guess contains in a different position.\n"
            f"Write your guess as {self.code_length} digits separated by spaces inside \\boxed{{}}, "
            f"for example \\boxed{{{self._example()}}}. Guessing the same code twice wastes a turn.\n"
            "Your guesses and their pegs will be listed as you play; use them to narrow down the code.\n"
            "Enter your first guess to start the game."
        )

    def task_suffix(self) -> str:
        return "Enter your next guess."

    def _tokens(self, move: str) -> list[str]:
        """The guess's digit strings: separated by spaces and/or commas, or written together ("1234")
        when every digit is one character, which is unambiguous for a code of that length."""
        tokens = move.replace(",", " ").split()
        if len(tokens) == 1 and self.num_numbers <= 9 and len(tokens[0]) == self.code_length > 1 and tokens[0].isdigit():
            return list(tokens[0])
        return tokens

    def _parse(self, move: str) -> tuple[int, ...] | str:
        """The guess as digits, or a message saying what is wrong with it (the careful path, for
        whatever the fast one in ``play`` does not read: leading zeros, non-digits, wrong counts)."""
        tokens = self._tokens(move)
        try:
            # ASCII only: int() also reads other scripts' digits, which a code never contains.
            guess = tuple(map(int, tokens)) if all(map(str.isascii, tokens)) else ()
        except ValueError:
            guess = ()
        if not guess:
            return f"{echo(move)} is not a list of digits separated by spaces"
        if len(guess) != self.code_length:
            return f"your guess {echo(self._show(guess))} has {len(guess)} digits, but the code has {self.code_length}"
        if min(guess) < 1 or max(guess) > self.num_numbers:
            return f"your guess {echo(self._show(guess))} uses digits outside 1 to {self.num_numbers}"
        return guess

    @staticmethod
    def _show(code: Sequence[int]) -> str:
        return " ".join(map(str, code))

    def play(self, move: str) -> Move:
        # Fast path: every token is a canonical digit of this game (the table also checks the range).
        tokens = self._tokens(move)
        guess = tuple(map(_digit_values(self.num_numbers).get, tokens))
        if len(guess) == self.code_length and None not in guess:
            shown = " ".join(tokens)
        else:
            guess = self._parse(move)
            if type(guess) is str:
                return illegal(f"At turn {self.turn}, {guess}.")
            shown = self._show(guess)
        guessed = self.guessed
        if guess in guessed:
            return illegal(f"At turn {self.turn}, you guessed {shown} again; you already know its pegs.")
        black, white = score_guess(self.secret, guess)
        self.history.append((guess, black, white))
        guessed.add(guess)
        reward = 0.0
        best_black = self.best_black
        if black > best_black:  # progress: reward only the improvement, so a win sums to 1
            reward = (black - best_black) / self.code_length
            self.best_black = black
        if black == self.code_length:
            return won(
                f"Congratulations! {shown} is the secret code; you cracked it in {self.turn} turns.",
                reward,
                {"black_pegs": black, "white_pegs": white},
            )
        return moved(
            f"At turn {self.turn}, you guessed {shown}: {black} black peg(s) and {white} white peg(s).",
            reward,
            {"black_pegs": black, "white_pegs": white},
        )

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        return observation + f" The secret code was {self._show(self.secret)}.", reward

    def random_move(self) -> str:
        return self._show(self._draw_code())

    # -- solver ----------------------------------------------------------------------------------
    def consistent_codes(self) -> np.ndarray:
        """All codes that agree with every black/white answer so far (reads only the feedback)."""
        codes = _all_codes(self.code_length, self.num_numbers, self.duplicate_numbers)
        counts = _digit_counts(codes, self.num_numbers)
        for guess, black, white in self.history:
            keys = _feedback_keys(codes, counts, np.asarray(guess, dtype=np.int8), self.num_numbers)
            keep = keys == black * (self.code_length + 1) + white
            codes, counts = codes[keep], counts[keep]
        return codes

    def oracle_move(self) -> str:
        """A code consistent with all feedback, chosen to shrink the worst-case set of remaining codes
        (Knuth's minimax rule over a sample of the consistent codes). Never looks at the secret."""
        remaining = self.consistent_codes()
        if len(remaining) <= 2:
            return self._show(remaining[0].tolist()) if len(remaining) else self.random_move()
        counts = _digit_counts(remaining, self.num_numbers)
        # Score a spread of candidate guesses at once; the sample shrinks for huge code spaces so the
        # (codes x guesses x digits) arrays stay a few MB.
        pool_size = max(1, min(_ORACLE_GUESS_POOL, _ORACLE_CELLS // (len(remaining) * counts.shape[1])))
        stride = -(-len(remaining) // pool_size)  # ceil
        pool, pool_counts = remaining[::stride], counts[::stride]
        # Summing position by position (and digit by digit) beats reducing a short last axis.
        black = sum((remaining[:, k, None] == pool[None, :, k]).astype(np.int16) for k in range(self.code_length))
        common = sum(np.minimum(counts[:, d, None], pool_counts[None, :, d]).astype(np.int16) for d in range(1, counts.shape[1]))
        keys = black * (self.code_length + 1) + (common - black)  # (codes, guesses)
        width = (self.code_length + 1) ** 2
        per_guess = np.bincount((keys + np.arange(len(pool)) * width).ravel(), minlength=len(pool) * width)
        worst_case = per_guess.reshape(len(pool), width).max(axis=1)
        return self._show(pool[int(np.argmin(worst_case))].tolist())  # argmin: first of the best, deterministic
