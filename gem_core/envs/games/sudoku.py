"""Sudoku: fill a 4x4 or 9x9 grid so every row, column and box holds each digit once."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache

from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import echo, echo_bare

# (scale, clues, max_turns) settings that the random variant draws from (GEM's table).
RANDOM_SETTINGS: tuple[tuple[int, int, int], ...] = ((4, 10, 15), (9, 50, 50))
DEFAULT_CLUES = {4: 10, 9: 50}
_SYMBOLS = ".123456789"
_MOVE = re.compile(r"^r?\s*(\d+)[\s,]+c?\s*(\d+)[\s,]+(\d+)$", re.IGNORECASE)


@lru_cache(maxsize=4)
def _geometry(scale: int) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The units (rows, columns, boxes) as flat cell indices, and each cell's peers (the other cells
    of its row, column and box)."""
    box = math.isqrt(scale)
    rows = [tuple(r * scale + c for c in range(scale)) for r in range(scale)]
    cols = [tuple(r * scale + c for r in range(scale)) for c in range(scale)]
    boxes = [tuple((top + r) * scale + left + c for r in range(box) for c in range(box)) for top in range(0, scale, box) for left in range(0, scale, box)]
    units = tuple(rows + cols + boxes)
    peers = tuple(tuple(sorted({j for unit in units if i in unit for j in unit} - {i})) for i in range(scale * scale))
    return units, peers


@lru_cache(maxsize=4)
def _board_template(scale: int) -> str:
    """The rendered grid as a ``str.format`` template with one ``{}`` per cell (one call per render)."""
    box = math.isqrt(scale)
    header, rule = _frame(scale)
    lines = [header, rule]
    for r in range(scale):
        groups = [" ".join(["{}"] * box)] * box
        lines.append(f"{r + 1:>2} | " + " | ".join(groups) + " |")
        if (r + 1) % box == 0:
            lines.append(rule)
    return "\n".join(lines)


@lru_cache(maxsize=4)
def _frame(scale: int) -> tuple[str, str]:
    """The column-number header and the horizontal rule of a rendered grid."""
    box = math.isqrt(scale)
    rule = "   +" + "+".join(["-" * (2 * box + 1)] * box) + "+"
    header = "     " + "   ".join(" ".join(str(c + 1) for c in range(s * box, (s + 1) * box)) for s in range(box))
    return header, rule


def _propagate(
    options: list[int],
    units: Sequence[Sequence[int]],
    peers: Sequence[Sequence[int]],
    every_digit: int,
    todo: list[int] | None = None,
) -> bool:
    """Narrow the per-cell digit bitmasks in place with the two classic rules until nothing changes:
    a settled cell's digit leaves its peers, and a digit with one possible cell in a unit goes there.
    Returns False as soon as a cell or a unit has no way left to be filled.

    ``todo``: the settled cells whose digit may not have left their peers yet; by default every
    settled cell. Pass just the changed cells when ``options`` was already propagated before them:
    the rules only ever remove digits, so the fixed point is the same and far fewer cells are spread.
    """
    # A worklist of settled cells whose digit still has to leave their peers: each cell is settled
    # (and spread) once, instead of rescanning the grid every round. Same fixed point as rescanning.
    if todo is None:
        todo = [cell for cell, mask in enumerate(options) if not mask & (mask - 1)]
    while True:
        while todo:
            cell = todo.pop()
            mask = options[cell]
            if not mask:
                return False
            for peer in peers[cell]:
                other = options[peer]
                if other & mask:
                    other &= ~mask
                    if not other:
                        return False
                    options[peer] = other
                    if not other & (other - 1):
                        todo.append(peer)
        for unit in units:
            seen_once = seen_twice = 0
            for cell in unit:
                seen_twice |= seen_once & options[cell]
                seen_once |= options[cell]
            if seen_once != every_digit:
                return False  # some digit has no place left in this unit
            only_here = seen_once & ~seen_twice
            if not only_here:
                continue
            for cell in unit:
                forced = options[cell] & only_here
                if forced and options[cell] != forced:
                    if forced & (forced - 1):
                        return False  # two digits both need this one cell
                    options[cell] = forced
                    todo.append(cell)
        if not todo:
            return True


def _all_digits(scale: int) -> int:
    """The bitmask of every digit 1..scale (bit d = digit d)."""
    return ((1 << (scale + 1)) - 1) & ~1


def _masks(cells: Sequence[int], scale: int) -> list[int]:
    """Per-cell digit bitmasks of a grid (0 = empty: every digit still possible)."""
    every_digit = _all_digits(scale)
    return [every_digit if not digit else 1 << digit for digit in cells]


def solve_sudoku(cells: Sequence[int], scale: int) -> list[int] | None:
    """A completion of ``cells`` (flat, row by row, 0 = empty) that obeys the rules, or ``None``.

    Constraint propagation (see ``_propagate``) at every node of a depth-first search that branches
    on the open cell with the fewest digits left; digits are kept as bitmasks (bit d = digit d).
    """
    return _complete(_masks(cells, scale), scale)


def _complete(options: list[int], scale: int, todo: list[int] | None = None) -> list[int] | None:
    """``solve_sudoku`` on digit bitmasks: propagates ``options`` in place (see ``_propagate`` for
    ``todo``), then searches. Returns a completion, or ``None`` when there is none."""
    units, peers = _geometry(scale)
    every_digit = _all_digits(scale)
    if not _propagate(options, units, peers, every_digit, todo):
        return None
    pending = [options]
    while pending:
        options = pending.pop()
        branch_cell, fewest = -1, scale + 1
        for cell, mask in enumerate(options):
            if mask & (mask - 1):
                count = mask.bit_count()
                if count < fewest:
                    branch_cell, fewest = cell, count
                    if count == 2:
                        break
        if branch_cell < 0:  # every cell settled, and propagation left no clash
            return [mask.bit_length() - 1 for mask in options]
        mask = options[branch_cell]
        while mask:
            digit_bit = mask & -mask
            mask ^= digit_bit
            trial = list(options)
            trial[branch_cell] = digit_bit
            if _propagate(trial, units, peers, every_digit, [branch_cell]):  # the rest was propagated already
                pending.append(trial)
    return None


class Sudoku(TextGame):
    """Fill the empty cells of a ``scale`` x ``scale`` Sudoku (4 or 9) within ``max_turns`` moves.

    ``clues`` follows GEM's meaning, despite the name: it is how many cells are *emptied* from a full
    grid, so the puzzle starts with ``scale**2 - clues`` given digits (GEM's hard setting, 50 of 81,
    leaves 31 givens). GEM tries that many removals and keeps a removal only while the solution stays
    unique; here exactly ``clues`` cells are emptied with no uniqueness search (so reset is fast), and
    in exchange the game accepts any valid completion, not one stored answer.

    A move ``row col digit`` (1-based) fills an empty cell. It is accepted when the digit clashes with
    nothing in its row, column and box and the grid can still be completed; filled cells (givens or
    earlier moves) cannot be overwritten. Rewards follow GEM's dense scheme: each accepted digit earns
    ``1 / (number of empty cells at the start)``, so a solved puzzle sums to 1; rejected moves earn 0.
    ``None`` for ``scale`` draws a setting from :data:`RANDOM_SETTINGS`; ``clues`` ``None`` uses that
    scale's default and ``max_turns`` ``None`` the drawn (or the matching) setting's limit, at least ``clues``.
    """

    title = "Sudoku"

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "scale": Param(int, choices=(4, 9), none="drawn per episode"),
        "clues": Param(int, low=1, high=81, none="the scale's default"),
    }

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        scale, clues = args["scale"], args["clues"]
        if scale is not None and clues is not None and clues > scale * scale:
            raise invalid("clues", clues, f"the number of cells to empty, between 1 and {scale * scale} for scale {scale}")

    def __init__(self, scale: int | None = 9, clues: int | None = 30, max_turns: int | None = 100):
        check_args(type(self), {"scale": scale, "clues": clues, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._setting_args = (scale, clues)
        self.scale = scale or 4
        self.clues = clues or 1
        self.board: list[int] = []  # flat, row by row; 0 = empty
        self.given: list[bool] = []
        self.solution: list[int] = []  # always a valid completion of the current board
        self.initial_empty = 1
        self._options: list[int] | None = None  # see _candidates

    # -- generation ------------------------------------------------------------------------------
    def new_game(self) -> None:
        scale, clues = self._setting_args
        default_turns = None
        if scale is None:
            scale, drawn_clues, default_turns = RANDOM_SETTINGS[self._randint(0, len(RANDOM_SETTINGS) - 1)]
            clues = clues if clues is not None and clues <= scale * scale else drawn_clues
        if clues is None:
            clues = DEFAULT_CLUES[scale]
        if self._max_turns_arg is None:  # the setting's limit, but never fewer turns than empty cells
            self.max_turns = max(clues, default_turns or next(t for s, _, t in RANDOM_SETTINGS if s == scale))
        self.scale, self.clues = scale, clues
        self.solution = self._full_grid()
        self.board = list(self.solution)
        for cell in self.np_random.choice(scale * scale, size=clues, replace=False):
            self.board[cell] = 0
        self.given = [digit != 0 for digit in self.board]
        self.initial_empty = clues
        self._options = None

    def _full_grid(self) -> list[int]:
        """A random complete grid: a valid base pattern with its digits, bands, stacks, lines within
        them and orientation shuffled, all of which keep every row, column and box complete."""
        scale = self.scale
        box = math.isqrt(scale)
        # One batch of uniforms feeds every shuffle (a Generator call per shuffle would dominate reset).
        uniforms = iter(self.np_random.random(scale + 2 * (box + box * box) + 1).tolist())

        def shuffled(values: list[int]) -> list[int]:
            for k in range(len(values) - 1, 0, -1):  # Fisher-Yates
                j = int(next(uniforms) * (k + 1))
                values[k], values[j] = values[j], values[k]
            return values

        def line_order() -> list[int]:  # shuffle the bands, then the lines inside each band
            return [band * box + line for band in shuffled(list(range(box))) for line in shuffled(list(range(box)))]

        digits = shuffled(list(range(1, scale + 1)))
        # The classic base pattern: cell (r, c) holds (box * (r % box) + r // box + c) % scale.
        base = [[digits[(box * (r % box) + r // box + c) % scale] for c in range(scale)] for r in range(scale)]
        if next(uniforms) < 0.5:
            base = [list(column) for column in zip(*base)]  # transpose
        row_order, col_order = line_order(), line_order()
        return [base[r][c] for r in row_order for c in col_order]

    # -- text ------------------------------------------------------------------------------------
    def state_text(self) -> str:
        return self.render_board()

    def instructions(self) -> str:
        box = math.isqrt(self.scale)
        return (
            f"You are playing Sudoku on a {self.scale}x{self.scale} grid.\n"
            f"Fill every empty cell ('.') with a digit from 1 to {self.scale} so that each row, each column and each "
            f"{box}x{box} box contains every digit exactly once. Rows and columns are numbered 1 to {self.scale}.\n"
            "A move is the row, the column and the digit inside \\boxed{}: for example \\boxed{1 2 3} writes 3 in "
            "row 1, column 2.\n"
            "You may only fill empty cells: the given digits and the digits you have placed cannot be changed. "
            "A digit that repeats one in its row, column or box, or that leaves the grid impossible to complete, "
            "is rejected and costs the turn.\n"
            f"You have {self.max_turns} turns for {self.initial_empty} empty cells."
        )

    def render_board(self) -> str:
        """The grid as text, with row/column numbers and lines between the boxes."""
        return _board_template(self.scale).format(*[_SYMBOLS[d] for d in self.board])

    _suffix_cache: tuple[tuple[int, ...], str] | None = None  # a class default: see TextGame._rand_buf

    def task_suffix(self) -> str:
        # Most steps leave the grid as it was (rejected moves): reuse the text while the board is unchanged.
        board = tuple(self.board)
        cached = self._suffix_cache
        if cached is not None and cached[0] == board:
            return cached[1]
        text = f"Here is the current grid:\n{self.render_board()}\nEnter your next move."
        self._suffix_cache = (board, text)
        return text

    # -- moves -----------------------------------------------------------------------------------
    def _candidates(self) -> list[int]:
        """Per-cell digit bitmasks of the current board after propagation. Made on the first move that
        needs them, then narrowed as digits are placed (never widened: filled cells stay filled)."""
        options = self._options
        if options is None:
            options = self._options = _masks(self.board, self.scale)
            _propagate(options, *_geometry(self.scale), _all_digits(self.scale))
        return options

    def _clash(self, cell: int, digit: int) -> str | None:
        """Which of the cell's row, column and box already holds ``digit``, if any."""
        units, _ = _geometry(self.scale)
        row, col = divmod(cell, self.scale)
        box = math.isqrt(self.scale)
        box_index = (row // box) * box + col // box
        for name, unit in (("row", units[row]), ("column", units[self.scale + col]), ("box", units[2 * self.scale + box_index])):
            if any(self.board[other] == digit for other in unit):
                return f"its {name}"
        return None

    def play(self, move: str) -> Move:
        match = _MOVE.match(move)
        if not match:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a move; write the row, column and digit, e.g. 1 2 3.")
        row, col, digit = (int(g) for g in match.groups())
        if not (1 <= row <= self.scale and 1 <= col <= self.scale and 1 <= digit <= self.scale):
            got = f"{row} {col} {digit}"
            return illegal(f"At turn {self.turn}, row, column and digit must each be between 1 and {self.scale}; got {echo_bare(got)}.")
        where = f"row {row}, column {col}"
        cell = (row - 1) * self.scale + col - 1
        if self.board[cell]:
            whose = "a given digit" if self.given[cell] else "a digit you placed"
            return illegal(f"At turn {self.turn}, {where} already holds {self.board[cell]} ({whose}); fill an empty cell.")
        clash = self._clash(cell, digit)
        if clash:
            return illegal(f"At turn {self.turn}, {digit} cannot go at {where}: {clash} already has a {digit}.")
        # Propagation on the current board (cached) settles most moves at once: a digit it ruled out
        # there is part of no completion.
        options = self._candidates()
        if not options[cell] >> digit & 1:
            return illegal(f"At turn {self.turn}, {digit} at {where} breaks no rule yet, but leaves the grid impossible to complete.")
        narrowed = list(options)
        narrowed[cell] = 1 << digit
        if digit == self.solution[cell]:
            _propagate(narrowed, *_geometry(self.scale), _all_digits(self.scale), todo=[cell])  # cannot fail: the completion agrees
        else:
            # Not the completion we know of; accept it if some other completion agrees with it.
            completion = _complete(narrowed, self.scale, todo=[cell])
            if completion is None:
                return illegal(f"At turn {self.turn}, {digit} at {where} breaks no rule yet, but leaves the grid impossible to complete.")
            self.solution = completion
        self._options = narrowed
        self.board[cell] = digit
        reward = 1.0 / self.initial_empty
        if 0 not in self.board:
            return won(f"Congratulations! You completed the Sudoku in {self.turn} turns.", reward)
        return moved(f"At turn {self.turn}, you placed {digit} at {where}.", reward)

    def random_move(self) -> str:
        return f"{self._randint(1, self.scale)} {self._randint(1, self.scale)} {self._randint(1, self.scale)}"

    def oracle_move(self) -> str:
        """Fill the first empty cell from the stored completion (kept valid for the current board)."""
        cell = self.board.index(0) if 0 in self.board else 0
        return f"{cell // self.scale + 1} {cell % self.scale + 1} {self.solution[cell]}"
