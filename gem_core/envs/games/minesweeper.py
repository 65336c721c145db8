"""Minesweeper: uncover every safe cell of a grid without stepping on a mine."""

from __future__ import annotations

import re
from functools import lru_cache

from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, lost, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import echo, echo_bare

_SEPARATORS = re.compile(r"[\s,()\[\]]+")
_ACTIONS = ("reveal", "flag")
_DIGITS = "012345678"


@lru_cache(maxsize=32)
def _column_header(cols: int) -> str:
    """Column numbers, right-aligned in 3-character cells to sit above the board's symbols."""
    return "   " + "".join(f"{c:>3}" for c in range(cols))


@lru_cache(maxsize=32)
def _neighbours(rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    """For each flat cell index, the flat indices of its (up to 8) neighbours."""
    table = []
    for r in range(rows):
        for c in range(cols):
            table.append(
                tuple(rr * cols + cc for rr in range(max(0, r - 1), min(rows, r + 2)) for cc in range(max(0, c - 1), min(cols, c + 2)) if (rr, cc) != (r, c))
            )
    return tuple(table)


class Minesweeper(TextGame):
    """Reveal all ``rows * cols - num_mines`` safe cells within ``max_turns`` moves.

    Moves are ``reveal r c`` and ``flag r c`` (0-based row and column; ``flag`` toggles a marker and
    is optional for winning). Mines are laid after the first reveal, away from it and its neighbours
    when the board has room, so the first reveal is always safe and opens an area. Revealing a cell
    with no adjacent mines also reveals its neighbours, spreading through connected zeros (flagged
    cells are skipped). Rewards follow GEM's dense scheme: each reveal earns the share of safe cells
    it uncovered, so a cleared board sums to 1; hitting a mine ends the game with 0; flags, invalid
    moves and the rest earn 0. Unlike GEM, winning does not also require flagging every mine.
    ``rows``/``cols`` ``None`` draws an n x n board (n from 5 to 8) per episode; ``num_mines`` ``None``
    means a fifth of the cells and ``max_turns`` ``None`` one turn per cell.
    """

    title = "Minesweeper"

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "rows": Param(int, low=1, high=30, none="a square board drawn per episode"),
        "cols": Param(int, low=1, high=30, none="a square board drawn per episode"),
        "num_mines": Param(int, low=1, none="a fifth of the cells"),
    }

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        rows, cols, mines = args["rows"], args["cols"], args["num_mines"]
        if rows is not None and cols is not None and mines is not None and mines >= rows * cols:
            raise invalid("num_mines", mines, f"an integer in 1..{rows * cols - 1}, to leave a safe cell on {rows}x{cols} cells")

    def __init__(
        self,
        rows: int | None = 8,
        cols: int | None = 8,
        num_mines: int | None = 10,
        max_turns: int | None = 20,
    ):
        check_args(type(self), {"rows": rows, "cols": cols, "num_mines": num_mines, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._random_size = rows is None or cols is None
        self._size_args = (rows, cols, num_mines)
        self.rows, self.cols, self.num_mines = rows or 1, cols or 1, num_mines or 1
        self.is_mine: list[bool] = []
        self.adjacent: list[int] = []  # number of neighbouring mines, per cell
        self.revealed: list[bool] = []
        self.flagged: list[bool] = []
        self.mines_laid = False
        self.revealed_count = 0
        self.exploded_at: int | None = None
        self.mine_order: list[int] = []

    # -- setup -----------------------------------------------------------------------------------
    @property
    def safe_cells(self) -> int:
        """How many cells have no mine (the number to reveal)."""
        return self.rows * self.cols - self.num_mines

    def new_game(self) -> None:
        rows, cols, num_mines = self._size_args
        if self._random_size:
            rows = cols = self._randint(5, 8)
        if num_mines is None:
            num_mines = rows * cols // 5
        num_mines = min(num_mines, rows * cols - 1)  # a fixed mine count on a drawn board must still fit
        self.rows, self.cols, self.num_mines = rows, cols, num_mines
        if self._max_turns_arg is None:
            self.max_turns = rows * cols
        cells = rows * cols
        self.is_mine = [False] * cells
        self.adjacent = [0] * cells
        self.revealed = [False] * cells
        self.flagged = [False] * cells
        self.mines_laid = False
        self.revealed_count = 0
        self.exploded_at = None
        # Mines are laid at the first reveal, but drawn now: an order of the cells to take them from.
        # Drawing later would make the board depend on RNG use between reset and that move.
        self.mine_order = self.np_random.permutation(cells).tolist()

    def _lay_mines(self, first: int) -> None:
        """Place the mines anywhere but ``first`` (and its neighbours, if enough cells remain)."""
        neighbours = _neighbours(self.rows, self.cols)
        keep_clear = {first, *neighbours[first]}
        if self.rows * self.cols - len(keep_clear) < self.num_mines:
            keep_clear = {first}
        # The first cells of the order drawn at reset that are not kept clear: a uniform random choice.
        mines = [i for i in self.mine_order if i not in keep_clear][: self.num_mines]
        for i in mines:
            self.is_mine[i] = True
        self.adjacent = [sum(self.is_mine[j] for j in around) for around in neighbours]
        self.mines_laid = True

    # -- text ------------------------------------------------------------------------------------
    def state_text(self) -> str:
        return self.render_board()

    def instructions(self) -> str:
        last_r, last_c = self.rows - 1, self.cols - 1
        return (
            "You are playing Minesweeper.\n"
            f"The board has {self.rows} rows and {self.cols} columns, numbered from 0, and hides {self.num_mines} mines. "
            f"Reveal every cell without a mine within {self.max_turns} turns to win.\n"
            "Moves, written inside \\boxed{}:\n"
            f"- \\boxed{{reveal {last_r // 2} {last_c // 2}}} uncovers the cell at row {last_r // 2}, column {last_c // 2}. "
            "A revealed cell shows how many of its 8 neighbours hold mines; a 0 uncovers its neighbours automatically.\n"
            f"- \\boxed{{flag 0 {last_c}}} puts a flag on (or takes it off) the cell at row 0, column {last_c}, "
            "to mark a suspected mine. Flagged cells cannot be revealed until unflagged.\n"
            "Revealing a mine ends the game. Your first reveal is always safe.\n"
            "On the board, '.' is a hidden cell, 'F' a flag and a digit a revealed cell. "
            "Reason from the numbers to find safe cells, and do not pick cells that are already revealed."
        )

    def render_board(self) -> str:
        """The board as text: row and column numbers, '.', 'F', digits, and '*' for mines once lost."""
        show_mines = self.exploded_at is not None
        symbols = [
            "*" if show_mines and mine else _DIGITS[count] if shown else "F" if flag else "."
            for mine, count, shown, flag in zip(self.is_mine, self.adjacent, self.revealed, self.flagged)
        ]
        cols = self.cols
        lines = [_column_header(cols)]
        for r in range(self.rows):
            lines.append(f"{r:>3}  " + "  ".join(symbols[r * cols : (r + 1) * cols]))
        return "\n".join(lines)

    def task_suffix(self) -> str:
        return f"Here is the current board:\n{self.render_board()}\nEnter your next move."

    # -- moves -----------------------------------------------------------------------------------
    def _parse(self, move: str) -> tuple[str, int, int] | str:
        """``(action, row, col)``, or a message saying what is wrong with the move."""
        tokens = [t for t in _SEPARATORS.split(move) if t]
        if len(tokens) != 3 or tokens[0].lower() not in _ACTIONS:
            return f"{echo(move)} is not a move; write 'reveal ROW COL' or 'flag ROW COL', e.g. reveal 0 0"
        try:
            row, col = int(tokens[1]), int(tokens[2])
        except ValueError:
            return f"{echo(move)} does not give the row and column as whole numbers"
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            return f"cell ({echo_bare(row)}, {echo_bare(col)}) is off the board; rows run 0-{self.rows - 1}, columns 0-{self.cols - 1}"
        return tokens[0].lower(), row, col

    def play(self, move: str) -> Move:
        parsed = self._parse(move)
        if isinstance(parsed, str):
            return illegal(f"At turn {self.turn}, {parsed}.")
        action, row, col = parsed
        cell = row * self.cols + col
        if self.revealed[cell]:
            return illegal(f"At turn {self.turn}, cell ({row}, {col}) is already revealed; choose a hidden cell.")
        if action == "flag":
            self.flagged[cell] = not self.flagged[cell]
            what = "placed a flag on" if self.flagged[cell] else "removed the flag from"
            return moved(f"At turn {self.turn}, you {what} cell ({row}, {col}).")
        if self.flagged[cell]:
            return illegal(f"At turn {self.turn}, cell ({row}, {col}) is flagged; remove the flag before revealing it.")
        if not self.mines_laid:
            self._lay_mines(cell)
        if self.is_mine[cell]:
            self.exploded_at = cell
            return lost(f"Boom! Cell ({row}, {col}) held a mine. Game over.")
        uncovered = self._reveal_from(cell)
        reward = uncovered / self.safe_cells
        if self.revealed_count == self.safe_cells:
            return won(f"Congratulations! You revealed every safe cell in {self.turn} turns.", reward)
        return moved(f"At turn {self.turn}, you revealed cell ({row}, {col}), uncovering {uncovered} cell(s).", reward)

    def _reveal_from(self, start: int) -> int:
        """Reveal ``start``; spread through cells with no adjacent mine. Returns how many were uncovered."""
        neighbours = _neighbours(self.rows, self.cols)
        revealed, flagged, adjacent = self.revealed, self.flagged, self.adjacent
        revealed[start] = True
        frontier = [start]
        uncovered = 1
        while frontier:
            cell = frontier.pop()
            if adjacent[cell]:
                continue  # a number stops the spread
            for other in neighbours[cell]:
                if not revealed[other] and not flagged[other]:  # a zero's neighbours are never mines
                    revealed[other] = True
                    uncovered += 1
                    frontier.append(other)
        self.revealed_count += uncovered
        return uncovered

    def random_move(self) -> str:
        action = "flag" if self.np_random.random() < 0.1 else "reveal"  # GEM's 9:1 mix
        return f"{action} {self._randint(0, self.rows - 1)} {self._randint(0, self.cols - 1)}"

    def oracle_move(self) -> str:
        """Reveal a hidden safe cell (reads the mines); unflag one if flags hide the last safe cells."""
        if not self.mines_laid:
            centre = (self.rows // 2) * self.cols + self.cols // 2
            start = next((i for i in [centre, *range(self.rows * self.cols)] if not self.flagged[i]), centre)
            return f"{'flag' if self.flagged[start] else 'reveal'} {start // self.cols} {start % self.cols}"
        hidden_safe = [i for i in range(self.rows * self.cols) if not self.revealed[i] and not self.is_mine[i]]
        target = next((i for i in hidden_safe if not self.flagged[i]), hidden_safe[0] if hidden_safe else 0)
        return f"{'flag' if self.flagged[target] else 'reveal'} {target // self.cols} {target % self.cols}"
