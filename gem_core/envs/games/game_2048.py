"""2048: slide a grid of numbered tiles, merging equal neighbours, until a target tile appears."""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, lost, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import echo

DIRECTIONS = ("up", "down", "left", "right")

# Turn budgets of the random variant (GEM's pairs).
_TURNS_FOR_TARGET = {16: 20, 32: 30, 64: 50}
_TARGET_CHOICES = tuple(_TURNS_FOR_TARGET)

# line -> line after sliding towards index 0 and merging. Shared by all games; a 4-wide line has at
# most 18**4 values, and play only ever meets a small part of them.
_SLID: dict[tuple[int, ...], tuple[int, ...]] = {}


def turn_budget(target_tile: int) -> int:
    """The turn limit used when only the target is fixed: GEM's value, or one turn per point of it."""
    return _TURNS_FOR_TARGET.get(target_tile, target_tile)


def slide_line(line: tuple[int, ...]) -> tuple[int, ...]:
    """Slide a line towards its start: close the gaps, then merge equal neighbours once, first pair first.

    ``(2, 2, 2, 2) -> (4, 4, 0, 0)``, ``(4, 4, 8, 0) -> (8, 8, 0, 0)``: a merged tile does not merge again.
    """
    slid = _SLID.get(line)
    if slid is None:
        tiles = [t for t in line if t]
        merged: list[int] = []
        i = 0
        while i < len(tiles):
            if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
                merged.append(2 * tiles[i])
                i += 2
            else:
                merged.append(tiles[i])
                i += 1
        slid = _SLID[line] = tuple(merged) + (0,) * (len(line) - len(merged))
    return slid


@cache
def board_lines(size: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """For each direction, the board's cell indices as lines that start at the edge tiles slide to."""
    rows = [tuple(range(r * size, (r + 1) * size)) for r in range(size)]
    cols = [tuple(range(c, size * size, size)) for c in range(size)]
    return {
        "left": tuple(rows),
        "right": tuple(row[::-1] for row in rows),
        "up": tuple(cols),
        "down": tuple(col[::-1] for col in cols),
    }


def slide_board(board: list[int], size: int, direction: str) -> list[int] | None:
    """The board after sliding every line in ``direction``, or None if nothing would move."""
    new = None
    for cells in board_lines(size)[direction]:
        line = tuple([board[i] for i in cells])
        slid = slide_line(line)
        if slid != line:
            if new is None:
                new = board.copy()
            for i, value in zip(cells, slid):
                new[i] = value
    return new


def can_move(board: list[int], size: int) -> bool:
    """Whether any direction changes the board: an empty cell, or two equal neighbours."""
    if 0 in board:
        return True
    for r in range(size):
        base = r * size
        for c in range(size):
            value = board[base + c]
            if (c + 1 < size and board[base + c + 1] == value) or (r + 1 < size and board[base + size + c] == value):
                return True
    return False


class _CellTexts(dict):
    """Tile value -> its text padded to a fixed width (empty cells as dots), filled on first use."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def __missing__(self, value: int) -> str:
        text = self[value] = (str(value) if value else ".").rjust(self.width)
        return text


@cache
def _board_layout(size: int, width: int) -> tuple[str, _CellTexts]:
    """A %-template for a size x size grid and the padded texts of tiles for one column width."""
    row = " ".join(["%s"] * size)
    return "\n".join([row] * size), _CellTexts(width)


def _child_generator(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator spawned from ``rng``'s seed sequence; ``rng``'s own draws are untouched."""
    if hasattr(rng, "spawn"):  # numpy >= 1.25
        return rng.spawn(1)[0]
    return np.random.default_rng(rng.bit_generator._seed_seq.spawn(1)[0])


def _snake_weights(size: int) -> list[float]:
    """Cell weights falling geometrically along a snake from the top-left corner (the oracle's taste)."""
    weights = [0.0] * (size * size)
    rank = 0
    for r in range(size):
        cols = range(size) if r % 2 == 0 else range(size - 1, -1, -1)
        for c in cols:
            weights[r * size + c] = 4.0**-rank
            rank += 1
    return weights


class Game2048(TextGame):
    """Reach ``target_tile`` on a ``board_size`` x ``board_size`` 2048 board within ``max_turns`` turns.

    After each move that changes the board, a 2 (90%) or a 4 (10%) appears on a random empty cell; a
    move that changes nothing is an invalid move and adds no tile. Rewards (GEM's dense scheme): each
    time the largest tile grows, the log2 progress towards the target, ``(log2 new - log2 old) /
    (log2 target - log2 start)``, so a won episode's rewards add up to 1; 0 otherwise. The episode
    ends when the target appears, when no move is left, or at the turn limit. ``None`` settings draw
    a target of 16, 32 or 64 per episode, with GEM's turn limits.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "2048"

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "target_tile": Param(int, low=8, high=2**20, none="drawn per episode"),
        "board_size": Param(int, low=2, high=10),
    }

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        target = args["target_tile"]
        if target is not None and target & (target - 1):
            raise invalid("target_tile", target, "a power of two in 8..1048576, or None (drawn per episode)")

    def __init__(self, target_tile: int | None = 2048, max_turns: int | None = 1000, board_size: int = 4):
        check_args(type(self), {"target_tile": target_tile, "max_turns": max_turns, "board_size": board_size}, type(self).__name__)
        super().__init__(max_turns)
        self._target_tile_arg = target_tile
        self.target_tile = target_tile or 2048
        self.size = board_size
        self.board: list[int] = [0] * (board_size * board_size)  # cells in reading order, 0 is empty
        self.start_max = 2  # the largest tile at the start (the progress scale's zero)
        self.max_tile = 2  # the largest tile reached so far, capped at the target
        self._action_rng: np.random.Generator | None = None  # random_move's own stream, made on first use

    # -- the game --------------------------------------------------------------------------------
    def new_game(self) -> None:
        if self._target_tile_arg is None:
            self.target_tile = _TARGET_CHOICES[self._randint(0, len(_TARGET_CHOICES) - 1)]
        else:
            self.target_tile = self._target_tile_arg
        if self._max_turns_arg is None:
            self.max_turns = turn_budget(self.target_tile)
        self._action_rng = None
        # Two starting tiles on distinct cells, drawn with one RNG call.
        cells = self.size * self.size
        first_cell, second_cell, first_value, second_value = self.np_random.random(4).tolist()
        first = int(first_cell * cells)
        second = int(second_cell * (cells - 1))
        second += second >= first  # skip the cell already taken
        self.board = [0] * cells
        self.board[first] = 2 if first_value < 0.9 else 4
        self.board[second] = 2 if second_value < 0.9 else 4
        self.start_max = self.max_tile = max(self.board)

    def _spawn(self) -> None:
        """Put a 2 (90%) or a 4 (10%) on a uniformly chosen empty cell."""
        board = self.board
        empty = [i for i in range(len(board)) if not board[i]]
        if empty:
            where, which = self.np_random.random(2).tolist()  # one RNG call for both draws
            board[empty[int(where * len(empty))]] = 2 if which < 0.9 else 4

    def render(self) -> str:
        """The board, one row per line, empty cells as dots."""
        template, texts = _board_layout(self.size, max(4, len(str(max(self.board)))))
        return template % tuple([texts[v] for v in self.board])

    def state_text(self) -> str:
        return self.render()

    def instructions(self) -> str:
        return (
            f"You are playing 2048 on a {self.size}x{self.size} board.\n"
            f"Goal: make a tile of {self.target_tile} within {self.max_turns} turns.\n"
            "Each turn, slide all tiles up, down, left or right as far as they go. Two equal tiles that collide "
            "merge into one tile of their sum; a tile merges at most once per move.\n"
            "After every move that changes the board, a new 2 (sometimes a 4) appears on an empty cell. "
            "A move that changes nothing is wasted. The game ends when no move is possible.\n"
            "Put the direction inside \\boxed{}, for example \\boxed{left}.\n"
            f"The board:\n{self.render()}\n"
            "Enter your first move."
        )

    def play(self, move: str) -> Move:
        direction = move.lower()
        if direction not in DIRECTIONS:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a direction; use up, down, left or right.")
        slid = slide_board(self.board, self.size, direction)
        if slid is None:
            return illegal(
                f"At turn {self.turn}, moving {direction} changes nothing, so no tile was added. Try another direction.",
                {"max_tile": max(self.board)},
            )
        self.board = slid
        reward = self._progress_reward()
        if self.max_tile >= self.target_tile:
            return won(f"Congratulations! You made the {self.target_tile} tile in {self.turn} turns.", reward, {"max_tile": max(self.board)})
        self._spawn()
        if not can_move(self.board, self.size):
            return lost(
                f"At turn {self.turn}, you moved {direction}. Game over: no move can change the board.\nThe board:\n{self.render()}",
                reward,
                {"max_tile": max(self.board)},
            )
        return moved(f"At turn {self.turn}, you moved {direction}.\nThe board:\n{self.render()}", reward, {"max_tile": max(self.board)})

    def _progress_reward(self) -> float:
        """Log-scale progress of the largest tile since the last record, capped at the target."""
        largest = min(max(self.board), self.target_tile)
        if largest <= self.max_tile:
            return 0.0
        gained = math.log2(largest) - math.log2(self.max_tile)
        self.max_tile = largest
        return self.success_reward * gained / (math.log2(self.target_tile) - math.log2(self.start_max))

    # -- players ---------------------------------------------------------------------------------
    def random_move(self) -> str:
        # Drawn from a child stream of np_random (spawning one leaves the parent's stream as it is),
        # so sampling an action never shifts the tile spawns: a snapshot taken before sampling
        # replays the same game.
        if self._action_rng is None:
            self._action_rng = _child_generator(self.np_random)
        return DIRECTIONS[int(self._action_rng.integers(4))]

    def oracle_move(self) -> str:
        """A strong heuristic move: a two-ply expectimax (move, random tile, move) over a board score.

        The score rewards empty cells and big tiles ordered along a snake from the top-left corner.
        It reads no RNG, so calling it does not change the game.
        """
        size = self.size
        weights = _snake_weights(size)

        def score(board: list[int]) -> float:
            return sum(v * w for v, w in zip(board, weights)) * (1.0 + 0.1 * board.count(0))

        def best_reply(board: list[int]) -> float:
            best = 0.0
            for direction in DIRECTIONS:
                after = slide_board(board, size, direction)
                if after is not None:
                    best = max(best, score(after))
            return best

        choice, choice_value = None, -1.0
        for direction in DIRECTIONS:
            after = slide_board(self.board, size, direction)
            if after is None:
                continue
            if max(after) >= self.target_tile:
                return direction
            empty = [i for i, v in enumerate(after) if not v]
            expected = 0.0
            for cell in empty:
                for tile, chance in ((2, 0.9), (4, 0.1)):
                    after[cell] = tile
                    expected += chance * best_reply(after)
                after[cell] = 0
            value = expected / len(empty) if empty else score(after)
            if value > choice_value:
                choice, choice_value = direction, value
        return choice or "left"
