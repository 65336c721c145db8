"""Word Search: find listed words hidden in a grid of letters."""

from __future__ import annotations

import math
import string
from functools import lru_cache

import numpy as np

from typing import ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo, echo_bare
from gem_core.utils.words import words_between

# (row step, col step). Basic puzzles read left to right or top to bottom; hardcore ones also run
# backwards and along both diagonals, as in a newspaper word search.
BASIC_DIRECTIONS = ((0, 1), (1, 0))
ALL_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (-1, 1), (0, -1), (-1, 0), (-1, -1), (1, -1))
MIN_LENGTH, MAX_LENGTH = 4, 7
_LETTERS = np.array(list(string.ascii_lowercase))
_STRIP = str.maketrans("", "", "[]()")


def _fits(grid: list[list[str | None]], word: str, row: int, col: int, dr: int, dc: int) -> bool:
    size = len(grid)
    end_r, end_c = row + dr * (len(word) - 1), col + dc * (len(word) - 1)
    if not (0 <= row < size and 0 <= col < size and 0 <= end_r < size and 0 <= end_c < size):
        return False
    return all(grid[row + i * dr][col + i * dc] in (None, letter) for i, letter in enumerate(word))


def _place_all(words: list[str], size: int, directions: tuple, rng: np.random.Generator) -> dict | None:
    """Place every word (they may share letters); ``None`` when some word finds no room."""
    grid: list[list[str | None]] = [[None] * size for _ in range(size)]
    placements: dict[str, tuple[int, int, int, int]] = {}
    positions = len(directions) * size * size
    for word in sorted(words, key=len, reverse=True):
        spot = None
        # Random tries first (cheap): one uniform draw picks (direction, row, col) together.
        for draw in rng.random(64).tolist():
            d, cell = divmod(int(draw * positions), size * size)
            r, c = divmod(cell, size)
            if _fits(grid, word, r, c, *directions[d]):
                spot = (r, c, *directions[d])
                break
        if spot is None:  # crowded grid: look at every position
            every = [(r, c, dr, dc) for dr, dc in directions for r in range(size) for c in range(size) if _fits(grid, word, r, c, dr, dc)]
            if not every:
                return None
            spot = every[int(rng.integers(len(every)))]
        r, c, dr, dc = spot
        for i, letter in enumerate(word):
            grid[r + i * dr][c + i * dc] = letter
        placements[word] = spot
    return {"grid": grid, "placements": placements}


class WordSearch(TextGame):
    """Find the ``num_words`` listed words in a square letter grid within ``max_turns`` moves.

    A move names the first and last cell of a word: ``\\boxed{row col row col}`` (0-based); either
    end may come first. Basic puzzles run words across (left to right) or down; ``hardcore`` ones
    also backwards and diagonally, in all eight directions. The word list is shown in both modes.
    Rewards: each new word found pays ``0.5 / num_words``; finding the last one pays the rest, so a
    solved puzzle returns exactly 1.0 and an unsolved one at most 0.5 (GEM pays ``1 / num_words``
    per word with no completion bonus). A straight segment that spells no listed word pays 0.
    Cells outside the grid, a single cell, a bent line (or a diagonal in a basic puzzle), a segment
    tried before, a word already found and unreadable moves are invalid (reward 0, turn used).
    Words (4-7 letters) come from the ``common`` tier of ``gem_core.utils.words``. All settings
    ``None``: 3-6 words, a random mode, and 4 turns per word.
    """

    title = "Word Search"
    progress_share = 0.5

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "num_words": Param(int, low=1, high=15, none="drawn per episode"),
        "hardcore": Param(bool, none="drawn per episode"),
    }

    def __init__(self, num_words: int | None = 5, hardcore: bool | None = False, max_turns: int | None = 20):
        check_args(type(self), {"num_words": num_words, "hardcore": hardcore, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._num_words_arg = num_words
        self._hardcore_arg = hardcore
        self.num_words = num_words or 5
        self.hardcore = bool(hardcore)
        self.grid: list[str] = []
        self.words: list[str] = []  # in the order shown to the player (alphabetical)
        self.placements: dict[str, tuple[int, int, int, int]] = {}  # word -> (row, col, drow, dcol)
        self.found: list[str] = []
        self.tried: set[tuple[int, int, int, int]] = set()
        self.progress_paid = 0.0

    @property
    def directions(self) -> tuple[tuple[int, int], ...]:
        """The (row step, col step) directions words may run in this puzzle."""
        return ALL_DIRECTIONS if self.hardcore else BASIC_DIRECTIONS

    def new_game(self) -> None:
        rng = self.np_random
        self.num_words = self._randint(3, 6) if self._num_words_arg is None else self._num_words_arg
        self.hardcore = bool(rng.integers(2)) if self._hardcore_arg is None else bool(self._hardcore_arg)
        if self._max_turns_arg is None:
            self.max_turns = 4 * self.num_words
        pool = words_between(MIN_LENGTH, MAX_LENGTH)
        words: list[str] = []
        while len(words) < self.num_words:
            word = pool[int(rng.integers(len(pool)))]
            # No word inside another (forwards or backwards): each listed word has one clear place.
            if all(word not in w and word[::-1] not in w and w not in word and w[::-1] not in word for w in words):
                words.append(word)
        size = max(max(map(len, words)) + 1, math.ceil(math.sqrt(3 * sum(map(len, words)))))
        while (puzzle := _place_all(words, size, self.directions, rng)) is None:
            size += 1
        fillers = _LETTERS[rng.integers(26, size=(size, size))].tolist()
        self.grid = ["".join([ch or filler for ch, filler in zip(row, spare)]) for row, spare in zip(puzzle["grid"], fillers)]
        self.placements = puzzle["placements"]
        self.words = sorted(words)
        self.found = []
        self.tried = set()
        self.progress_paid = 0.0

    # -- text ------------------------------------------------------------------------------------
    def render(self) -> str:
        """The letter grid with row and column numbers."""
        return render_grid(self.grid)

    def state_text(self) -> str:
        return "Still to find: " + ", ".join(w.upper() for w in self.words if w not in self.found)

    def instructions(self) -> str:
        if self.hardcore:
            ways = "in any of the eight directions: across, down, diagonally, and backwards along any of these"
        else:
            ways = "across (left to right) or down (top to bottom)"
        return (
            "You are playing Word Search.\n"
            f"Find these {self.num_words} words in the grid within {self.max_turns} turns: "
            f"{', '.join(w.upper() for w in self.words)}.\n"
            f"Words run in a straight line, {ways}.\n"
            "Rows and columns are numbered from 0. To mark a word, give its first and last cell as "
            "'row col row col' inside \\boxed{}, for example \\boxed{0 0 0 4} for a 5-letter word along row 0 from column 0.\n"
            f"Grid:\n{self.render()}"
        )

    def task_suffix(self) -> str:
        left = [w.upper() for w in self.words if w not in self.found]
        found = ", ".join(w.upper() for w in self.found) or "none"
        return f"Found {len(self.found)}/{self.num_words}: {found}. Still to find: {', '.join(left)}.\nEnter your next move."

    # -- moves -----------------------------------------------------------------------------------
    def play(self, move: str) -> Move:
        tokens = move.translate(_STRIP).replace(",", " ").split()
        numbers = [_as_int(t) for t in tokens]
        if len(numbers) != 4 or None in numbers:
            return illegal(
                f"At turn {self.turn}, {echo(move)} is not a move. Give four numbers, 'row col row col', for example \\boxed{{0 0 0 4}}.",
            )
        r1, c1, r2, c2 = numbers
        where = f"({echo_bare(r1)}, {echo_bare(c1)}) to ({echo_bare(r2)}, {echo_bare(c2)})"
        size = len(self.grid)
        if not all(0 <= n < size for n in numbers):
            return illegal(f"At turn {self.turn}, {where} leaves the grid (rows and columns are 0-{size - 1}).")
        dr, dc = r2 - r1, c2 - c1
        if dr == 0 and dc == 0:
            return illegal(f"At turn {self.turn}, {where} is a single cell; a word spans several.")
        if dr and dc and abs(dr) != abs(dc):
            return illegal(f"At turn {self.turn}, {where} is not a straight line across, down or diagonal.")
        if dr and dc and not self.hardcore:
            return illegal(f"At turn {self.turn}, {where} is diagonal; in this puzzle words run across or down only.")
        key = min((r1, c1, r2, c2), (r2, c2, r1, c1))
        if key in self.tried:
            return illegal(f"At turn {self.turn}, you already tried {where}.")
        self.tried.add(key)
        steps = max(abs(dr), abs(dc))
        sr, sc = (dr > 0) - (dr < 0), (dc > 0) - (dc < 0)
        letters = "".join(self.grid[r1 + i * sr][c1 + i * sc] for i in range(steps + 1))
        word = next((w for w in (letters, letters[::-1]) if w in self.words), None)
        if word is None:
            return moved(f"At turn {self.turn}, {where} reads {letters.upper()}, which is not a word on the list.")
        if word in self.found:
            return illegal(f"At turn {self.turn}, you have already found {word.upper()}.")
        self.found.append(word)
        message = f"At turn {self.turn}, you found {word.upper()} at {where}."
        if len(self.found) == self.num_words:
            reward = self.success_reward - self.progress_paid
            self.progress_paid = self.success_reward
            return won(f"{message} Congratulations! You found every word in {self.turn} turns.", reward)
        reward = self.progress_share / self.num_words
        self.progress_paid += reward
        return moved(message, reward)

    def random_move(self) -> str:
        """A straight segment of two or more cells, in a direction this puzzle uses."""
        size = len(self.grid)
        r, c = self._randint(0, size - 1), self._randint(0, size - 1)
        # Either way along an allowed direction (a segment may be given end first), where there is room.
        options = [(sdr, sdc, room) for dr, dc in self.directions for sdr, sdc in ((dr, dc), (-dr, -dc)) if (room := _room(size, r, c, sdr, sdc)) > 0]
        dr, dc, room = options[int(self.np_random.integers(len(options)))]
        steps = self._randint(1, room)
        return f"{r} {c} {r + steps * dr} {c + steps * dc}"

    def oracle_move(self) -> str:
        """Reads the answer key: the first listed word not yet found."""
        word = next((w for w in self.words if w not in self.found), self.words[0])
        r, c, dr, dc = self.placements[word]
        n = len(word) - 1
        return f"{r} {c} {r + n * dr} {c + n * dc}"


def render_grid(rows: list[str] | list[list[str]]) -> str:
    """A grid of one-character cells as text, upper-cased, with 0-based row and column numbers."""
    header, labels, gap = _grid_frame(len(rows), len(rows[0]))
    return header + "".join([label + gap.join(row).upper() for label, row in zip(labels, rows)])


@lru_cache(maxsize=64)
def _grid_frame(num_rows: int, num_cols: int) -> tuple[str, tuple[str, ...], str]:
    """The column header, the row labels (each starting a new line) and the gap between cells: the
    parts of a rendered grid that depend only on its size (games render theirs every turn)."""
    width = len(str(max(num_rows, num_cols) - 1))
    header = " " * (width + 1) + " ".join(str(c).rjust(width) for c in range(num_cols))
    gap = " " * width  # cells are one character: right-align them under the column numbers
    labels = tuple("\n" + str(r).rjust(width) + gap for r in range(num_rows))
    return header, labels, gap


def _room(size: int, row: int, col: int, dr: int, dc: int) -> int:
    """How many steps fit from (row, col) in direction (dr, dc) before leaving the grid."""
    limits = []
    for pos, step in ((row, dr), (col, dc)):
        if step > 0:
            limits.append(size - 1 - pos)
        elif step < 0:
            limits.append(pos)
    return min(limits)


def _as_int(token: str) -> int | None:
    try:
        return int(token)
    except ValueError:
        return None
