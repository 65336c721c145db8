"""Sokoban: push every box onto a target in a small walled room.

Puzzles are made backwards, which is what makes reset fast and every puzzle solvable: carve a room,
put the boxes on their targets, then play in reverse (the player *pulls* boxes) for a bounded number
of moves. Played forwards, that reverse path is a solution, so its length bounds the shortest
solution, and the budget keeps it below ``max_turns``. The oracle does not replay that path: it runs
an A* solver on whatever board is in front of it.

Cells are addressed by flat index ``row * cols + col``; the outer ring is always wall, so a
neighbour offset never leaves the grid from a floor cell.

One file, as every game here is (about 700 lines): the generator, the A* oracle and the env share the
board's cell indexing and move rules, which a split would have to export.
"""

from __future__ import annotations

import copy
import functools
import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import echo

DIRECTIONS = ("up", "down", "left", "right")
_UNREACHABLE = 1 << 30

# (dr, dc) stamps carved around the walker: a cell plus a bar, an L or a 2x2 block, so rooms get
# both corridors and open areas.
_STAMPS = (
    ((0, 0), (0, -1), (0, 1)),
    ((0, 0), (-1, 0), (1, 0)),
    ((0, 0), (0, -1), (1, 0)),
    ((0, 0), (0, -1), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_WALK_STEPS = ((-1, 0), (1, 0), (0, -1), (0, 1))

# Symbols of the text board (the gym-sokoban / GEM convention, plus one for a player on a target).
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"


def _uniforms(rng: Any, batch: int = 128) -> Iterator[float]:
    """Endless uniform floats from the env's RNG, drawn in batches (one numpy call per reset, not
    one per draw, which would dominate the cost of a reset)."""
    while True:
        yield from rng.random(batch).tolist()


class _RoomTables:
    """Per room size, what carving and rendering look up instead of computing: the interior
    cells, the clamped random-walk step from each cell, the interior cells each stamp covers
    around each cell, and each cell's wall/floor text token (symbol plus separator)."""

    def __init__(self, rows: int, cols: int):
        self.interior = tuple(r * cols + c for r in range(1, rows - 1) for c in range(1, cols - 1))
        size = rows * cols
        walk = []
        for dr, dc in _WALK_STEPS:
            table = [0] * size
            for cell in self.interior:
                r = min(max(cell // cols + dr, 1), rows - 2)
                c = min(max(cell % cols + dc, 1), cols - 2)
                table[cell] = r * cols + c
            walk.append(tuple(table))
        self.walk = tuple(walk)
        stamp_cells = []
        for stamp in _STAMPS:
            table = [()] * size
            for cell in self.interior:
                r, c = divmod(cell, cols)
                table[cell] = tuple((r + dr) * cols + c + dc for dr, dc in stamp if 0 < r + dr < rows - 1 and 0 < c + dc < cols - 1)
            stamp_cells.append(tuple(table))
        self.stamp_cells = tuple(stamp_cells)
        seps = ["\n" if i % cols == cols - 1 else " " for i in range(size)]
        seps[-1] = ""
        self.wall_tokens = tuple(WALL + sep for sep in seps)
        self.floor_tokens = tuple(FLOOR + sep for sep in seps)
        self.target_tokens = tuple(TARGET + sep for sep in seps)


@functools.cache
def _room_tables(rows: int, cols: int) -> _RoomTables:
    return _RoomTables(rows, cols)


def _offsets(cols: int) -> tuple[int, int, int, int]:
    """Flat-index steps for up, down, left, right."""
    return (-cols, cols, -1, 1)


def _player_distances(open_cells: bytes, offsets: tuple[int, ...], start: int, boxes: Any, max_depth: int = _UNREACHABLE) -> list[int]:
    """Walking distance from ``start`` to every cell within ``max_depth`` steps (-1: farther, or
    unreachable without moving a box)."""
    free = bytearray(open_cells)
    for b in boxes:
        free[b] = 0
    free[start] = 0
    dist = [-1] * len(open_cells)
    dist[start] = 0
    up, down, left, right = offsets
    frontier = [start]
    d = 0
    while frontier and d < max_depth:
        d += 1
        nxt = []
        for cell in frontier:
            for n in (cell + up, cell + down, cell + left, cell + right):
                if free[n]:
                    free[n] = 0
                    dist[n] = d
                    nxt.append(n)
        frontier = nxt
    return dist


def push_distances(open_cells: bytes, cols: int, targets: Any) -> tuple[int, ...]:
    """Fewest pushes that bring a lone box from each cell to some target (walls only, other boxes
    ignored). Cells marked ``_UNREACHABLE`` are dead squares: a box there can never be solved."""
    offsets = _offsets(cols)
    dist = [_UNREACHABLE] * len(open_cells)
    frontier = list(targets)
    for t in frontier:
        dist[t] = 0
    d = 0
    while frontier:
        d += 1
        nxt = []
        for cell in frontier:
            for off in offsets:
                # A box at cell - off is pushed onto cell by a player standing at cell - 2 * off.
                before = cell - off
                stand = before - off
                if 0 <= stand < len(open_cells) and open_cells[before] and open_cells[stand] and dist[before] == _UNREACHABLE:
                    dist[before] = d
                    nxt.append(before)
        frontier = nxt
    return tuple(dist)


def _frozen_square(open_cells: bytes, cols: int, boxes: Any, targets: Any, cell: int) -> bool:
    """True when the box just pushed to ``cell`` completes a 2x2 block of walls and boxes with a
    box off target: none of those boxes can ever move again."""
    for corner in (cell, cell - 1, cell - cols, cell - cols - 1):
        square = (corner, corner + 1, corner + cols, corner + cols + 1)
        if all(not open_cells[c] or c in boxes for c in square) and any(c in boxes and c not in targets for c in square):
            return True
    return False


def _walk(open_cells: bytes, offsets: tuple[int, ...], start: int, goal: int, boxes: Any) -> list[int]:
    """A shortest walk (direction indices) from ``start`` to ``goal`` around the boxes."""
    came = {start: -1}
    frontier = [start]
    while goal not in came:
        nxt = []
        for cell in frontier:
            for direction, off in enumerate(offsets):
                n = cell + off
                if open_cells[n] and n not in came and n not in boxes:
                    came[n] = direction
                    nxt.append(n)
        frontier = nxt
    path = []
    cell = goal
    while cell != start:
        direction = came[cell]
        path.append(direction)
        cell -= offsets[direction]
    path.reverse()
    return path


def _assignment_cost(boxes: frozenset[int], target_dists: tuple[tuple[int, ...], ...]) -> int:
    """Fewest pushes if each box goes to its own target, other boxes ignored; ``_UNREACHABLE``
    or more when no assignment works. Tries every assignment for up to 4 boxes, else a DP over
    the set of targets used."""
    rows = [[dist[b] for dist in target_dists] for b in boxes]
    n = len(rows)
    if n == 1:
        return rows[0][0]
    if n == 2:
        (a0, a1), (b0, b1) = rows
        return min(a0 + b1, a1 + b0)
    if n == 3:
        r0, r1, r2 = rows
        return min(r0[i] + r1[j] + r2[k] for i, j, k in _permutations(3))
    if n == 4:
        r0, r1, r2, r3 = rows
        return min(r0[i] + r1[j] + r2[k] + r3[m] for i, j, k, m in _permutations(4))
    costs = {0: 0}  # bitmask of targets taken -> cheapest cost so far
    for row in rows:
        nxt: dict[int, int] = {}
        for used, cost in costs.items():
            for j, d in enumerate(row):
                if d < _UNREACHABLE and not used >> j & 1 and cost + d < nxt.get(used | 1 << j, _UNREACHABLE):
                    nxt[used | 1 << j] = cost + d
        if not nxt:
            return _UNREACHABLE
        costs = nxt
    return min(costs.values())


@functools.cache
def _permutations(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(itertools.permutations(range(n)))


def solve(
    open_cells: bytes,
    cols: int,
    targets: frozenset[int],
    player: int,
    boxes: frozenset[int],
    target_dists: tuple[tuple[int, ...], ...] | None = None,
    max_expansions: int = 100_000,
) -> list[int] | None:
    """Shortest move sequence (direction indices) that puts every box on a target, or ``None``.

    A* over push states: an edge is a walk to a box plus one push, costing the walk's length plus
    one, so walking is never searched move by move. The heuristic, the cheapest assignment of
    boxes to distinct targets in pushes (walls only), never overestimates and changes by at most
    one per push, so the first solution popped is optimal in moves. States where no assignment
    exists (dead squares included) and frozen 2x2 blocks are pruned. ``None`` also when
    ``max_expansions`` states were expanded without a solution. ``target_dists`` (one
    ``push_distances`` table per target) can be passed in to reuse them.
    """
    if target_dists is None:
        target_dists = tuple(push_distances(open_cells, cols, (t,)) for t in sorted(targets))
    offsets = _offsets(cols)
    h_cache: dict[frozenset[int], int] = {}
    h0 = h_cache[boxes] = _assignment_cost(boxes, target_dists)
    if h0 >= _UNREACHABLE:
        return None
    start = (player, boxes)
    # state -> (previous state, the box pushed, push direction); the start has no parent.
    parent: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], int, int] | None] = {start: None}
    best_g = {start: 0}
    heap = [(h0, 0, 0, player, boxes, h0)]
    counter = 0
    expansions = 0
    while heap:
        _, neg_g, _, p, bx, h = heapq.heappop(heap)
        g = -neg_g
        state = (p, bx)
        if best_g[state] < g:
            continue
        if h == 0:
            return _moves_along(open_cells, offsets, state, parent)
        expansions += 1
        if expansions > max_expansions:
            return None
        dist = _player_distances(open_cells, offsets, p, bx)
        for b in bx:
            for direction, off in enumerate(offsets):
                walk = dist[b - off]
                if walk < 0:
                    continue
                to = b + off
                if not open_cells[to] or to in bx:
                    continue
                nbx = (bx - {b}) | {to}
                nxt = (b, nbx)
                ng = g + walk + 1
                if ng >= best_g.get(nxt, _UNREACHABLE):
                    continue
                nh = h_cache.get(nbx)
                if nh is None:
                    nh = _assignment_cost(nbx, target_dists)
                    if _frozen_square(open_cells, cols, nbx, targets, to):
                        nh = _UNREACHABLE
                    h_cache[nbx] = nh
                if nh >= _UNREACHABLE:
                    continue
                best_g[nxt] = ng
                parent[nxt] = (state, b, direction)
                counter += 1
                heapq.heappush(heap, (ng + nh, -ng, counter, b, nbx, nh))
    return None


def _moves_along(open_cells: bytes, offsets: tuple[int, ...], state: Any, parent: dict) -> list[int]:
    """Expand the chain of pushes that ends in ``state`` into single moves."""
    pushes = []
    link = parent[state]
    while link is not None:
        pushes.append(link)
        link = parent[link[0]]
    moves: list[int] = []
    for (player, boxes), box, direction in reversed(pushes):
        moves += _walk(open_cells, offsets, player, box - offsets[direction], boxes)
        moves.append(direction)
    return moves


_MAX_ROOMS = 2000  # rooms tried per reset before giving up on an impossible setting


def default_max_turns(rows: int, cols: int, num_boxes: int) -> int:
    """The turn limit for drawn settings: 20 for 6x6 with 2 boxes, 50 for 8x8 with 4."""
    return max(10, 10 * num_boxes + 5 * (rows + cols - 12) // 2)


def solution_budget(max_turns: int) -> int:
    """Longest solution a generated puzzle may need: ``max_turns`` less some slack, so that a
    player who wastes a few moves can still win (16 of 20, 40 of 50)."""
    return max(1, max_turns - max(2, max_turns // 5))


def _cells_needed(boxes: int) -> int:
    """Interior cells (outer wall excluded) a room needs for ``boxes`` boxes: generation fails on fewer."""
    return 4 * boxes + 1


def _moves_needed(boxes: int) -> int:
    """The solution budget that generation needs for ``boxes`` boxes, measured over every room of
    5..12 a side: 2 moves a box up to 3 boxes; more boxes need longer solutions (12 for 4, 34 for 6)."""
    return 2 * boxes if boxes <= 3 else boxes * boxes + 4


class Sokoban(TextGame):
    """Push ``num_boxes`` boxes onto targets in a ``dim_room`` (rows, cols, outer wall included)
    room within ``max_turns`` moves.

    Actions: ``up``, ``down``, ``left``, ``right`` (case-insensitive). Rewards follow GEM: 1 when
    the last box lands on a target; 0 for every other move, and 0 for a blocked move (a no-op with
    a message, flagged ``invalid_action``); when the turns run out, the fraction of boxes on targets
    (GEM's soft ending). There is no per-push reward, since boxes can be pushed on and off a target
    to farm it. Every puzzle has a solution of at most ``solution_budget`` moves (below
    ``max_turns``) and starts with no box on a target. ``None`` settings are drawn per episode:
    rows and cols in 6-8, 2 boxes (up to 4 in larger rooms), and ``default_max_turns`` (20 for
    6x6 with 2 boxes, 50 for 8x8 with 4). The class defaults (6x6, 3 boxes, 100 turns) are GEM's.
    The board is shown in the instructions and in ``task_suffix`` (GEM shows it in the suffix).
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Sokoban"

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        # (rows, cols), the outer wall included; more than 12 a side makes puzzles slow to generate.
        "dim_room": Param(int, low=5, high=12, pair=True, none="drawn per episode"),
        "num_boxes": Param(int, low=1, high=6, none="drawn per episode"),
    }

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        rows, cols = args["dim_room"] if args["dim_room"] is not None else (None, None)
        boxes, max_turns = args["num_boxes"], args["max_turns"]
        # The room a reset may draw (rows and cols drawn in 6..8), and the most boxes it may draw.
        interior = ((rows or 6) - 2) * ((cols or 6) - 2)
        most = boxes if boxes is not None else min(max(min(rows or 8, cols or 8) - 4, 2), 4)
        room = f"a {rows or '6..8'}x{cols or '6..8'} room"
        if boxes is not None and interior < _cells_needed(boxes):
            fits = max(b for b in range(1, 7) if _cells_needed(b) <= interior) if interior >= _cells_needed(1) else 0
            raise invalid("num_boxes", boxes, f"at most {fits}: {room} is too small for {boxes} boxes")
        if max_turns is not None and solution_budget(max_turns) < _moves_needed(most):
            least = next(m for m in itertools.count(1) if solution_budget(m) >= _moves_needed(most))
            raise invalid("max_turns", max_turns, f"at least {least}: {max_turns} turns are too few for {most} boxes")

    def __init__(
        self,
        dim_room: tuple[int | None, int | None] | None = (6, 6),
        num_boxes: int | None = 3,
        max_turns: int | None = 100,
    ):
        check_args(type(self), {"dim_room": dim_room, "num_boxes": num_boxes, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        rows, cols = dim_room if dim_room is not None else (None, None)
        self._size_arg = (rows, cols)
        self._boxes_arg = num_boxes
        self.rows = rows or 6
        self.cols = cols or 6
        self.num_boxes = num_boxes or 2
        self.open_cells = b""  # 1 where the cell is floor (targets included), 0 for wall
        self.targets: frozenset[int] = frozenset()
        self.boxes: frozenset[int] = frozenset()
        self.player = 0
        self.solution_budget = 0
        self.generated_solution_length = 0  # the reverse path's length: a bound on the optimum
        self._target_dists: tuple[tuple[int, ...], ...] = ()  # per target, push distances (oracle)
        self._plan: tuple[tuple[tuple[int, frozenset[int]], int], ...] = ()
        self._board_tokens: tuple[str, ...] = ()
        self._rendered: tuple[Any, str] = (-1, "")  # (player, boxes) -> text, as play and the suffix both render

    # -- puzzle generation -----------------------------------------------------------------------
    def new_game(self) -> None:
        next_u = _uniforms(self.np_random).__next__
        rows, cols = self._size_arg
        self.rows = rows if rows is not None else 6 + int(next_u() * 3)
        self.cols = cols if cols is not None else 6 + int(next_u() * 3)
        if self._boxes_arg is not None:
            self.num_boxes = self._boxes_arg
        else:
            most = min(max(min(self.rows, self.cols) - 4, 2), 4)  # 2 boxes in a 6-wide room, up to 4 in an 8-wide one
            self.num_boxes = 2 + int(next_u() * (most - 1))
        if self._max_turns_arg is None:
            self.max_turns = default_max_turns(self.rows, self.cols, self.num_boxes)
        self.solution_budget = solution_budget(self.max_turns)
        for _ in range(_MAX_ROOMS):
            open_cells, floor = self._carve(next_u)
            for _ in range(3):  # a few target layouts per room before carving a new one
                found = self._scramble(open_cells, floor, next_u)
                if found is not None:
                    break
            if found is not None:
                break
        else:
            raise RuntimeError(
                f"could not make a {self.rows}x{self.cols} Sokoban puzzle with {self.num_boxes} boxes solvable in "
                f"{self.solution_budget} moves after {_MAX_ROOMS} rooms; use fewer boxes or more turns"
            )
        self.open_cells = open_cells
        self.targets, self.boxes, self.player, self.generated_solution_length = found
        self._target_dists = ()  # computed by the oracle when first needed
        self._plan = ()
        self._board_tokens = self._static_tokens()
        self._rendered = (-1, "")

    def _carve(self, next_u: Callable[[], float]) -> tuple[bytes, list[int]]:
        """A connected room (and its floor cells): a random walk over the interior stamping small
        floor shapes; if the walk ends short of the wanted size, wall cells next to the floor are
        opened at random (a walk alone would spend most of its steps re-covering floor)."""
        tables = _room_tables(self.rows, self.cols)
        interior, walk, stamp_cells = tables.interior, tables.walk, tables.stamp_cells
        grid = bytearray(self.rows * self.cols)
        floor: list[int] = []
        add = floor.append
        cell = interior[int(next_u() * len(interior))]
        steps = walk[int(next_u() * 4)]
        # About 13/16 of the interior becomes floor: open enough that boxes can be pulled far
        # (the puzzles come out about as long as GEM's), with walls left over for structure.
        need = min(len(interior), max(2 * self.num_boxes + 4, (len(interior) * 13) // 16))
        left = need
        for _ in range(self.rows + self.cols):
            # One draw per step: its integer part picks the stamp and whether to turn (1 in 3),
            # its fractional part the new direction.
            u = next_u() * 15.0
            k = int(u)
            if k < 5:
                steps = walk[int((u - k) * 4)]
            cell = steps[cell]
            for c in stamp_cells[k % 5][cell]:
                if not grid[c]:
                    grid[c] = 1
                    add(c)
                    left -= 1
            if left <= 0:
                break
        else:
            cols, spots = self.cols, len(interior)
            while left > 0:
                c = interior[int(next_u() * spots)]
                if not grid[c] and (grid[c - 1] or grid[c + 1] or grid[c - cols] or grid[c + cols]):
                    grid[c] = 1
                    add(c)
                    left -= 1
        return bytes(grid), floor

    def _scramble(self, open_cells: bytes, floor: list[int], next_u: Callable[[], float]) -> tuple[frozenset[int], frozenset[int], int, int] | None:
        """Place boxes on targets, then pull them away in reverse play within the move budget.

        Each reverse step walks the player to a box and pulls it one or more cells; its cost is
        the walk plus the pulls, exactly the forward moves that undo it. Returns (targets, boxes,
        player, cost) for the best-scoring state seen with no box left on a target (score: box
        switches times total displacement, as in gym-sokoban), or ``None`` (the caller retries).
        """
        cols = self.cols
        offsets = _offsets(cols)
        # A target only helps if a box on it can be pulled off: two open cells in a line beside it.
        # Drawing a cell and a direction and keeping the pair when it allows a pull favours cells
        # that can be left several ways, and costs a few draws instead of a scan of the room.
        targets: list[int] = []
        for _ in range(20 * self.num_boxes):
            u = next_u() * len(floor)
            cell = floor[int(u)]
            off = offsets[int((u - int(u)) * 4)]
            if open_cells[cell + off] and open_cells[cell + 2 * off] and cell not in targets:
                targets.append(cell)
                if len(targets) == self.num_boxes:
                    break
        else:
            return None
        boxes = list(targets)  # boxes[i] started on targets[i]
        where: dict[int, int] = {b: i for i, b in enumerate(boxes)}
        target_set = frozenset(targets)
        # Where the player stands in the solved state is free to choose: right beside a box it
        # can pull, so the first pull needs no walk (and no search).
        first = [
            (i, off)
            for i, b in enumerate(boxes)
            for off in offsets
            if open_cells[b + off] and open_cells[b + 2 * off] and b + off not in where and b + 2 * off not in where
        ]
        if not first:
            return None
        i, off = first[int(next_u() * len(first))]
        player = boxes[i] + off
        budget = self.solution_budget
        cost = 0
        switches = 0
        last_box = -1
        on_target = len(boxes)
        best: tuple[frozenset[int], frozenset[int], int, int] | None = None
        best_score = 0
        for rounds in range(4 * self.num_boxes + 4):
            if rounds:
                if cost >= budget:
                    break
                # Walks longer than what is left of the budget (less one pull) are of no use.
                dist = _player_distances(open_cells, offsets, player, where, budget - cost - 1)
                options = []
                stranded = []  # pulls of boxes still on a target: taken first, so every box gets moved off
                for i, b in enumerate(boxes):
                    for off in offsets:
                        stand = b + off
                        walk = dist[stand]
                        if walk >= 0 and open_cells[stand + off] and stand + off not in where:
                            (stranded if b in target_set else options).append((i, off, walk + 1))
                if stranded:
                    options = stranded
                elif not options:
                    break
                i, off, step_cost = options[int(next_u() * len(options))]
            else:
                step_cost = 1
            cost += step_cost
            b = boxes[i]
            on_target -= b in target_set
            # Pull: the player steps back from the box and drags it one cell; maybe keep going.
            while True:
                del where[b]
                b += off
                where[b] = i
                player = b + off
                nxt = player + off
                if cost == budget or not open_cells[nxt] or nxt in where or next_u() < 0.4:
                    break
                cost += 1
            boxes[i] = b
            on_target += b in target_set
            if i != last_box:
                switches += 1
                last_box = i
            if not on_target:
                displacement = 0
                for x, t in zip(boxes, targets):
                    displacement += abs(x // cols - t // cols) + abs(x % cols - t % cols)
                if switches * displacement > best_score:
                    best_score = switches * displacement
                    best = (target_set, frozenset(boxes), player, cost)
        return best

    def load_board(self, board: str) -> str:
        """Start an episode on a given board, written with the render symbols (spaces optional),
        e.g. for tests or hand-made levels. Returns the first observation."""
        lines = [line.replace(" ", "") for line in board.strip().splitlines() if line.strip()]
        rows, cols = len(lines), len(lines[0])
        if any(len(line) != cols for line in lines):
            raise ValueError("every board row must have the same number of cells")
        cells = "".join(lines)
        known = {WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET}
        if not set(cells) <= known:
            raise ValueError(f"unknown board symbols {sorted(set(cells) - known)}; use {' '.join(sorted(known))}")
        if sum(ch in (PLAYER, PLAYER_ON_TARGET) for ch in cells) != 1:
            raise ValueError("the board needs exactly one player")
        border = [i for i in range(rows * cols) if i // cols in (0, rows - 1) or i % cols in (0, cols - 1)]
        if any(cells[i] != WALL for i in border):
            raise ValueError("the outer ring of the board must be wall")
        boxes = frozenset(i for i, ch in enumerate(cells) if ch in (BOX, BOX_ON_TARGET))
        targets = frozenset(i for i, ch in enumerate(cells) if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET))
        if not boxes or len(boxes) != len(targets):
            raise ValueError(f"need as many targets as boxes (at least one), got {len(targets)} and {len(boxes)}")
        self.rows, self.cols, self.num_boxes = rows, cols, len(boxes)
        self.open_cells = bytes(ch != WALL for ch in cells)
        self.targets, self.boxes = targets, boxes
        self.player = next(i for i, ch in enumerate(cells) if ch in (PLAYER, PLAYER_ON_TARGET))
        self.max_turns = self._max_turns_arg or default_max_turns(rows, cols, self.num_boxes)
        self.solution_budget = self.generated_solution_length = 0  # unknown for a given board
        self._target_dists = ()
        self._plan = ()
        self._board_tokens = self._static_tokens()
        self._rendered = (-1, "")
        self.turn = 0
        self._done = False
        return self.instructions()

    # -- the game --------------------------------------------------------------------------------
    def _static_tokens(self) -> tuple[str, ...]:
        """Per cell, its fixed symbol (wall, floor, target) plus the separator that follows it."""
        tables = _room_tables(self.rows, self.cols)
        tokens = [f if o else w for o, f, w in zip(self.open_cells, tables.floor_tokens, tables.wall_tokens)]
        for t in self.targets:
            tokens[t] = tables.target_tokens[t]
        return tuple(tokens)

    def render(self) -> str:
        """The board as text, one row per line, cells separated by spaces."""
        key = (self.player, self.boxes)
        if self._rendered[0] == key:
            return self._rendered[1]
        tokens = list(self._board_tokens)
        targets = self.targets
        for b in self.boxes:
            tokens[b] = (BOX_ON_TARGET if b in targets else BOX) + tokens[b][1:]
        p = self.player
        tokens[p] = (PLAYER_ON_TARGET if p in targets else PLAYER) + tokens[p][1:]
        text = "".join(tokens)
        self._rendered = (key, text)
        return text

    def state_text(self) -> str:
        return self.render()

    def instructions(self) -> str:
        return (
            "You are playing Sokoban.\n"
            "You are the player in a walled room. Push every box onto a target.\n"
            "Each turn, move one cell: up, down, left or right. Walking into a box pushes it one cell the same way, "
            "provided the cell behind it is free floor or a target. You cannot pull a box, push two boxes at once, "
            "or walk through a wall.\n"
            f"Board symbols: '{WALL}' wall, '{FLOOR}' floor, '{TARGET}' empty target, '{BOX}' box, "
            f"'{BOX_ON_TARGET}' box on a target, '{PLAYER}' you, '{PLAYER_ON_TARGET}' you standing on a target.\n"
            f"You have {self.max_turns} turns. Put your move inside \\boxed{{}}, for example \\boxed{{up}}.\n"
            f"Starting board:\n{self.render()}\n"
            "Enter your first move."
        )

    def task_suffix(self) -> str:
        return f"Here is the current board:\n{self.render()}\nEnter your next move."

    def boxes_on_targets(self) -> int:
        """How many boxes currently sit on a target."""
        return len(self.boxes & self.targets)

    def play(self, move: str) -> Move:
        name = move.lower()
        if name not in _DIRECTION_INDEX:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a move. Use up, down, left or right.")
        off = _offsets(self.cols)[_DIRECTION_INDEX[name]]
        ahead = self.player + off
        if not self.open_cells[ahead]:
            return illegal(f"At turn {self.turn}, you cannot move {name}: there is a wall in the way.")
        pushed = ahead in self.boxes
        if pushed:
            beyond = ahead + off
            if not self.open_cells[beyond]:
                return illegal(f"At turn {self.turn}, you cannot move {name}: the box is against a wall.")
            if beyond in self.boxes:
                return illegal(f"At turn {self.turn}, you cannot move {name}: the box is blocked by another box.")
            self.boxes = (self.boxes - {ahead}) | {beyond}
        self.player = ahead
        on_target = self.boxes_on_targets()
        info = {"boxes_on_targets": on_target}
        if on_target == self.num_boxes:
            return won(f"Congratulations! You pushed every box onto a target in {self.turn} turns.", self.success_reward, info)
        what = f"moved {name} and pushed a box" if pushed else f"moved {name}"
        return moved(f"At turn {self.turn}, you {what}. Boxes on targets: {on_target}/{self.num_boxes}.", info=info)

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        """GEM's soft ending: the share of boxes on targets."""
        observation, _ = super().on_time_limit(observation, reward, invalid)
        return observation, self.success_reward * self.boxes_on_targets() / self.num_boxes

    def random_move(self) -> str:
        return DIRECTIONS[self._randint(0, 3)]

    def oracle_move(self) -> str:
        """The next move of an optimal solution of the current board, from the A* solver (the plan
        is cached and re-made when the board leaves it); any legal move when no solution is found."""
        state = (self.player, self.boxes)
        for planned_state, direction in self._plan:
            if planned_state == state:
                return DIRECTIONS[direction]
        if not self._target_dists:
            self._target_dists = tuple(push_distances(self.open_cells, self.cols, (t,)) for t in sorted(self.targets))
        moves = solve(self.open_cells, self.cols, self.targets, self.player, self.boxes, self._target_dists, max_expansions=20_000)
        if not moves:  # deadlocked (or too hard to prove): any move that changes the board
            self._plan = ()
            offsets = _offsets(self.cols)
            for direction, off in enumerate(offsets):
                ahead = self.player + off
                if self.open_cells[ahead] and (ahead not in self.boxes or self.open_cells[ahead + off] and ahead + off not in self.boxes):
                    return DIRECTIONS[direction]
            return DIRECTIONS[0]
        plan = []
        offsets = _offsets(self.cols)
        player, boxes = self.player, self.boxes
        for direction in moves:
            plan.append(((player, boxes), direction))
            player += offsets[direction]
            if player in boxes:
                boxes = (boxes - {player}) | {player + offsets[direction]}
        self._plan = tuple(plan)
        return DIRECTIONS[moves[0]]

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Everything but the RNG is immutable here, so only the RNG is deep-copied."""
        state = dict(self.__dict__)
        state.pop("spec", None)
        for key, value in state.items():
            if not isinstance(value, _IMMUTABLE):
                state[key] = copy.deepcopy(value)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v if isinstance(v, _IMMUTABLE) else copy.deepcopy(v) for k, v in state.items()})


_DIRECTION_INDEX = {name: i for i, name in enumerate(DIRECTIONS)}
_IMMUTABLE = (int, float, str, bytes, bool, type(None), tuple, frozenset)
