"""Fifteen Puzzle (n*n - 1 sliding tiles): slide tiles into the gap until they are in order."""

from __future__ import annotations

from functools import cache

from typing import ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo

# A direction names the way a TILE slides into the gap (GEM's convention): "up" moves the tile
# below the gap up, so the gap itself goes down one row.
DIRECTIONS = ("up", "down", "left", "right")
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}

# The longest scramble walk. It bounds the shortest solution, and with it the cost of the IDA*
# oracle: 40 keeps a 4x4 solve well under a second in pure Python (50 can take ten).
SCRAMBLE_CAP = 40

# Turn budgets of the random variant (GEM's pairs).
_TURNS_FOR_ROWS = {2: 10, 3: 20, 4: 50}
_ROW_CHOICES = tuple(_TURNS_FOR_ROWS)


def turn_budget(num_rows: int) -> int:
    """The turn limit used when only the size is fixed: GEM's value, or 3 moves per cell."""
    return _TURNS_FOR_ROWS.get(num_rows, 3 * num_rows * num_rows)


@cache
def gap_moves(num_rows: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """For each gap position, the legal (direction, new gap position) pairs, in DIRECTIONS order."""
    table = []
    for gap in range(num_rows * num_rows):
        row, col = divmod(gap, num_rows)
        options = []
        if row < num_rows - 1:
            options.append(("up", gap + num_rows))
        if row > 0:
            options.append(("down", gap - num_rows))
        if col < num_rows - 1:
            options.append(("left", gap + 1))
        if col > 0:
            options.append(("right", gap - 1))
        table.append(tuple(options))
    return tuple(table)


@cache
def _walk_steps(num_rows: int) -> tuple[dict[str, tuple[tuple[str, int], ...]], ...]:
    """For each gap position and last direction ("" for none), the moves that do not undo it."""
    return tuple({last: tuple(m for m in options if m[0] != _OPPOSITE.get(last)) for last in ("", *DIRECTIONS)} for options in gap_moves(num_rows))


# Where the tile that a direction moves sits, relative to the gap (for the invalid-move message).
_SIDE_OF_GAP = {"up": "below", "down": "above", "left": "to the right of", "right": "to the left of"}


@cache
def _board_layout(num_rows: int) -> tuple[str, tuple[str, ...]]:
    """A %-template for the grid and each tile's padded text (the gap, 0, is an underscore)."""
    width = len(str(num_rows * num_rows - 1))
    texts = tuple((str(tile) if tile else "_").rjust(width) for tile in range(num_rows * num_rows))
    row = " ".join(["%s"] * num_rows)
    return "\n".join([row] * num_rows), texts


@cache
def solved_board(num_rows: int) -> tuple[int, ...]:
    """Tiles 1..n*n-1 in reading order, the gap (0) last."""
    return tuple(range(1, num_rows * num_rows)) + (0,)


def is_solvable(board: tuple[int, ...] | list[int], num_rows: int) -> bool:
    """The classic parity test: can ``board`` reach the solved order by sliding tiles?"""
    tiles = [t for t in board if t]
    inversions = sum(1 for i in range(len(tiles)) for j in range(i + 1, len(tiles)) if tiles[i] > tiles[j])
    if num_rows % 2:
        return inversions % 2 == 0
    gap_row_from_bottom = num_rows - list(board).index(0) // num_rows  # 1 = bottom row
    return (inversions + gap_row_from_bottom) % 2 == 1


def apply_direction(board: list[int], num_rows: int, direction: str) -> bool:
    """Slide a tile into the gap in place; False (board unchanged) if no tile lies that way."""
    gap = board.index(0)
    for name, new_gap in gap_moves(num_rows)[gap]:
        if name == direction:
            board[gap], board[new_gap] = board[new_gap], 0
            return True
    return False


def manhattan_distance(board: tuple[int, ...] | list[int], num_rows: int) -> int:
    """Sum over tiles of the row and column distance to their home cell."""
    total = 0
    for cell, tile in enumerate(board):
        if tile:
            home = tile - 1
            total += abs(cell // num_rows - home // num_rows) + abs(cell % num_rows - home % num_rows)
    return total


def _line_conflicts(tiles: tuple[int, ...], line: int, num_rows: int, is_row: bool) -> int:
    """Extra moves forced by tiles that sit in their home row (or column) in reverse order.

    Two tiles in their home line but in the wrong order cost two moves beyond Manhattan distance;
    per line that is twice the fewest tiles to take out so that the rest are in order (the line
    length minus the longest increasing run of home positions). Admissible.
    """
    n = num_rows
    homes = []
    for tile in tiles:
        if tile:
            home = tile - 1
            if (home // n if is_row else home % n) == line:
                homes.append(home % n if is_row else home // n)
    if len(homes) < 2:
        return 0
    best = [1] * len(homes)
    for i in range(len(homes)):
        for j in range(i):
            if homes[j] < homes[i] and best[j] + 1 > best[i]:
                best[i] = best[j] + 1
    return 2 * (len(homes) - max(best))


@cache
def _conflict_tables(num_rows: int) -> tuple[list[dict[tuple[int, ...], int]], list[dict[tuple[int, ...], int]]]:
    """Per row and per column, a memo from the line's tiles to its linear-conflict cost (filled lazily)."""
    return [{} for _ in range(num_rows)], [{} for _ in range(num_rows)]


def solve(board: tuple[int, ...] | list[int], num_rows: int, max_depth: int = 200) -> list[str] | None:
    """A shortest list of directions that solves ``board`` (IDA* search), or None if none exists.

    The heuristic is Manhattan distance plus linear conflicts, both admissible, so the first
    solution found is optimal; both are updated incrementally, for the one or two lines a move
    touches. Unsolvable boards are rejected by the parity test up front.
    """
    n = num_rows
    state = list(board)
    if not is_solvable(state, n):
        return None
    # cost[tile][cell]: Manhattan distance of that tile placed at that cell.
    cost = [[0] * (n * n)] + [[abs(c // n - (t - 1) // n) + abs(c % n - (t - 1) % n) for c in range(n * n)] for t in range(1, n * n)]
    row_memo, col_memo = _conflict_tables(n)
    # Per gap position: (direction, new gap, is vertical, the two lines whose conflicts can change).
    # A vertical slide moves a tile to another row, so only those two rows' conflicts can change;
    # a horizontal one, only two columns.
    moves = []
    for gap, options in enumerate(gap_moves(n)):
        entries = []
        for direction, new_gap in options:
            vertical = direction in ("up", "down")
            lines = (gap // n, new_gap // n) if vertical else (gap % n, new_gap % n)
            entries.append((direction, new_gap, vertical, *lines))
        moves.append(entries)
    undo = {"up": "down", "down": "up", "left": "right", "right": "left", "": ""}
    path: list[str] = []

    # The conflict cost of every row and column of the current state, kept up to date.
    row_lc = [_line_conflicts(tuple(state[r * n : r * n + n]), r, n, True) for r in range(n)]
    col_lc = [_line_conflicts(tuple(state[c::n]), c, n, False) for c in range(n)]

    def lookup(key: tuple[int, ...], memo: dict[tuple[int, ...], int], line: int, is_row: bool) -> int:
        value = memo.get(key)
        if value is None:
            value = memo[key] = _line_conflicts(key, line, n, is_row)
        return value

    def search(gap: int, g: int, bound: int, h: int, last: str) -> int:
        """Depth-first search below ``bound``; -1 when solved (``path`` holds the moves), else the
        smallest f-value that exceeded the bound. ``h`` is Manhattan + conflicts of the state."""
        if h == 0:
            return -1
        smallest = 1 << 30
        forbidden = undo[last]  # undoing the last move never helps
        for direction, new_gap, vertical, a, b in moves[gap]:
            if direction == forbidden:
                continue
            tile = state[new_gap]
            state[gap], state[new_gap] = tile, 0
            if vertical:
                lines, memo = row_lc, row_memo
                new_a = lookup(tuple(state[a * n : a * n + n]), memo[a], a, True)
                new_b = lookup(tuple(state[b * n : b * n + n]), memo[b], b, True)
            else:
                lines, memo = col_lc, col_memo
                new_a = lookup(tuple(state[a::n]), memo[a], a, False)
                new_b = lookup(tuple(state[b::n]), memo[b], b, False)
            old_a, old_b = lines[a], lines[b]
            new_h = h - cost[tile][new_gap] + cost[tile][gap] - old_a - old_b + new_a + new_b
            f = g + 1 + new_h
            if f <= bound:
                lines[a], lines[b] = new_a, new_b
                path.append(direction)
                f = search(new_gap, g + 1, bound, new_h, direction)
                if f < 0:
                    return f
                path.pop()
                lines[a], lines[b] = old_a, old_b
            state[new_gap], state[gap] = tile, 0
            if f < smallest:  # noqa: PLR1730 -- cheaper than a min() call in the hot loop
                smallest = f
        return smallest

    gap = state.index(0)
    h = manhattan_distance(state, n) + sum(row_lc) + sum(col_lc)
    bound = h
    while bound <= max_depth:
        bound = search(gap, 0, bound, h, "")
        if bound < 0:
            return path
    return None


class FifteenPuzzle(TextGame):
    """Order the tiles of an ``num_rows`` x ``num_rows`` sliding puzzle within ``max_turns`` moves.

    Boards are scrambled by a random walk of at most ``min(max_turns, SCRAMBLE_CAP)`` moves from the
    solved order (no immediate undo), so every board is solvable and its shortest solution fits the
    turn limit (GEM shuffles the tiles instead: half of its boards are unsolvable, and most 3x3 and
    4x4 ones need more moves than the limit allows). The IDA* oracle proves each board solvable.
    Rewards (GEM's): 1 when solved; 0 for other moves; when the turns run out, the fraction of cells
    that hold their final tile (the gap counts as one). ``None`` settings draw a 2x2, 3x3 or 4x4
    board per episode, with GEM's turn limits.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Fifteen Puzzle"

    params: ClassVar[dict[str, Param]] = {**TextGame.params, "num_rows": Param(int, low=2, high=8, none="drawn per episode")}

    def __init__(self, num_rows: int | None = 2, max_turns: int | None = 20):
        check_args(type(self), {"num_rows": num_rows, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._num_rows_arg = num_rows
        self.num_rows = num_rows or 2
        self.board: list[int] = list(solved_board(self.num_rows))  # cells in reading order, 0 is the gap
        self.scramble_length = 0
        # The oracle's cached plan: the board it applies to and the remaining moves (last one first).
        self._plan_board: tuple[int, ...] | None = None
        self._plan: list[str] = []

    # -- the game --------------------------------------------------------------------------------
    def new_game(self) -> None:
        if self._num_rows_arg is None:
            self.num_rows = _ROW_CHOICES[self._randint(0, len(_ROW_CHOICES) - 1)]
        else:
            self.num_rows = self._num_rows_arg
        if self._max_turns_arg is None:
            self.max_turns = turn_budget(self.num_rows)
        self.board = self._scramble()
        self._plan_board, self._plan = None, []

    def _scramble(self) -> list[int]:
        """A random walk of the gap from the solved board, of L/2 to L steps, L = min(max_turns, SCRAMBLE_CAP).

        Its length bounds the shortest solution, which therefore fits the turn limit. A walk that
        happens to end on the solved board is redrawn.
        """
        n, steps = self.num_rows, _walk_steps(self.num_rows)
        goal = list(solved_board(n))
        longest = min(self.max_turns, SCRAMBLE_CAP)
        shortest = (longest + 1) // 2
        while True:
            # One batch of uniforms (the length, then one per step) is much faster than a draw per step.
            draws = self.np_random.random(longest + 1).tolist()
            length = shortest + int(draws[0] * (longest - shortest + 1))
            board, gap, last = goal.copy(), n * n - 1, ""
            for u in draws[1 : length + 1]:
                options = steps[gap][last]
                last, new_gap = options[int(u * len(options))]
                board[gap], board[new_gap] = board[new_gap], 0
                gap = new_gap
            if board != goal:
                self.scramble_length = length
                return board

    def render(self) -> str:
        """The board, one row per line; the gap is shown as an underscore."""
        template, texts = _board_layout(self.num_rows)
        return template % tuple([texts[tile] for tile in self.board])

    def state_text(self) -> str:
        return self.render()

    def instructions(self) -> str:
        last = self.num_rows * self.num_rows - 1
        return (
            f"You are playing the {last}-Puzzle, a {self.num_rows}x{self.num_rows} sliding puzzle.\n"
            f"Slide the tiles until they read 1 to {last} row by row with the gap (_) in the bottom-right corner. "
            f"You have {self.max_turns} turns.\n"
            "Each turn one tile next to the gap slides into it. Name the direction the tile moves:\n"
            "up (the tile below the gap), down (the tile above it), left (the tile to its right), right (the tile to its left).\n"
            "Put the direction inside \\boxed{}, for example \\boxed{up}.\n"
            f"The board:\n{self.render()}\n"
            "Enter your first move."
        )

    def play(self, move: str) -> Move:
        direction = move if move in _OPPOSITE else move.lower()
        if direction not in _OPPOSITE:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a direction; use up, down, left or right.")
        board = self.board
        if not apply_direction(board, self.num_rows, direction):
            side = _SIDE_OF_GAP[direction]
            return illegal(f"At turn {self.turn}, there is no tile {side} the gap, so {direction} is not possible.")
        if board[-1] == 0 and self.is_solved():
            return won(f"Congratulations! You solved the puzzle in {self.turn} turns.", self.success_reward)
        template, texts = _board_layout(self.num_rows)
        rendered = template % tuple([texts[tile] for tile in board])  # render(), inlined
        return moved(f"At turn {self.turn}, you moved a tile {direction}.\nThe board:\n{rendered}")

    def is_solved(self) -> bool:
        """Whether the tiles are in order with the gap last."""
        return tuple(self.board) == solved_board(self.num_rows)

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        goal = solved_board(self.num_rows)
        reward += sum(1 for have, want in zip(self.board, goal) if have == want) / len(goal)  # GEM's soft reward
        return observation, reward

    # -- players ---------------------------------------------------------------------------------
    def random_move(self) -> str:
        options = gap_moves(self.num_rows)[self.board.index(0)]
        return options[int(self.np_random.integers(len(options)))][0]

    def oracle_move(self) -> str:
        """The next move of a shortest solution, found by IDA* from the current board (then cached)."""
        current = tuple(self.board)
        if current != self._plan_board or not self._plan:
            plan = solve(current, self.num_rows)
            if not plan:
                raise RuntimeError(f"no solution from {current}")  # impossible for generated boards
            self._plan = plan[::-1]
        direction = self._plan.pop()
        after = list(current)
        apply_direction(after, self.num_rows, direction)
        self._plan_board = tuple(after)
        return direction
