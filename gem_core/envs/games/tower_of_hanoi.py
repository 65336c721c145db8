"""Tower of Hanoi: move a stack of disks from peg A to peg C, one disk at a time."""

from __future__ import annotations

import re

from typing import ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo

PEGS = "ABC"

# "A C", "A,C", "AC", "A->C", "A to C", "from A to C" (any case).
_MOVE_PATTERN = re.compile(r"(?:from\s+)?([abc])\s*(?:,|->|→|to\b)?\s*([abc])", re.IGNORECASE)

# Turn budgets of the random variant (GEM's pairs); each leaves room for the optimal 2**n - 1 moves.
_TURNS_FOR_DISKS = {3: 10, 4: 20, 5: 35}
_DISK_CHOICES = tuple(_TURNS_FOR_DISKS)

# The plain "A C" form (any case), looked up without the regex: (source index, destination index).
_PLAIN_MOVES = {f"{src}{sep}{dst}": (PEGS.index(src.upper()), PEGS.index(dst.upper())) for src in "ABCabc" for dst in "ABCabc" for sep in (" ", "")}


def turn_budget(num_disks: int) -> int:
    """The turn limit used when only the disk count is fixed: GEM's value, or optimal plus slack."""
    return _TURNS_FOR_DISKS.get(num_disks, 2**num_disks - 1 + num_disks)


class TowerOfHanoi(TextGame):
    """Move ``num_disks`` disks from peg A to peg C; never put a larger disk on a smaller one.

    Rewards (GEM's): 1 when all disks are on C; 0 for other moves, legal or not; when the turns run
    out, the fraction of disks that sit on C. ``num_disks``/``max_turns`` ``None`` draws 3, 4 or 5
    disks per episode with a turn limit that leaves room for the optimal solution.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Tower of Hanoi"

    params: ClassVar[dict[str, Param]] = {**TextGame.params, "num_disks": Param(int, low=1, high=20, none="drawn per episode")}

    def __init__(self, num_disks: int | None = 3, max_turns: int | None = 100):
        check_args(type(self), {"num_disks": num_disks, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._num_disks_arg = num_disks
        self.num_disks = num_disks or 3
        # Pegs as lists of disk sizes, bottom first; disk 1 is the smallest.
        self.pegs: list[list[int]] = [[], [], []]

    def new_game(self) -> None:
        if self._num_disks_arg is None:
            self.num_disks = _DISK_CHOICES[self._randint(0, len(_DISK_CHOICES) - 1)]
        else:
            self.num_disks = self._num_disks_arg
        if self._max_turns_arg is None:
            self.max_turns = turn_budget(self.num_disks)
        self.pegs = [list(range(self.num_disks, 0, -1)), [], []]

    def state_text(self) -> str:
        return self.render()

    def instructions(self) -> str:
        return (
            f"You are playing Tower of Hanoi with {self.num_disks} disks on three pegs, A, B and C.\n"
            f"Goal: move the whole stack from peg A to peg C within {self.max_turns} turns.\n"
            "Each turn you move the top disk of one peg onto another peg. A disk may never rest on a smaller disk.\n"
            "Disks are numbered by size (1 is the smallest); pegs are listed from bottom to top.\n"
            "Give the source peg and then the destination peg inside \\boxed{}, for example \\boxed{A C}.\n"
            f"{self.render()}\n"
            "Enter your first move."
        )

    def render(self) -> str:
        """The pegs, one line each, bottom disk first."""
        a, b, c = self.pegs
        return f"Pegs:\nA: {a}\nB: {b}\nC: {c}"

    def play(self, move: str) -> Move:
        plain = _PLAIN_MOVES.get(move)
        if plain is not None:
            src_index, dst_index = plain
        else:
            parsed = _MOVE_PATTERN.fullmatch(move)
            if parsed is None:
                return illegal(f"At turn {self.turn}, {echo(move)} is not a move. Write two peg letters, source then destination, like \\boxed{{A C}}.")
            src_index, dst_index = PEGS.index(parsed.group(1).upper()), PEGS.index(parsed.group(2).upper())
        src_name, dst_name = PEGS[src_index], PEGS[dst_index]
        pegs = self.pegs
        src, dst = pegs[src_index], pegs[dst_index]
        if src is dst:
            return illegal(f"At turn {self.turn}, you tried to move from peg {src_name} onto itself.")
        if not src:
            return illegal(f"At turn {self.turn}, you tried to move from peg {src_name}, which is empty.")
        if dst and dst[-1] < src[-1]:
            return illegal(f"At turn {self.turn}, disk {src[-1]} on peg {src_name} cannot go on the smaller disk {dst[-1]} on peg {dst_name}.")
        disk = src.pop()
        dst.append(disk)
        if len(pegs[2]) == self.num_disks:
            return won(f"Congratulations! You moved all {self.num_disks} disks to peg C in {self.turn} turns.", self.success_reward)
        return moved(f"At turn {self.turn}, you moved disk {disk} from peg {src_name} to peg {dst_name}.\n{self.render()}")

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, _ = super().on_time_limit(observation, reward, invalid)
        return observation, len(self.pegs[2]) / self.num_disks  # GEM's closeness reward

    def legal_moves(self) -> list[tuple[int, int]]:
        """All (source, destination) peg indices that are legal now."""
        return [(s, d) for s in range(3) if self.pegs[s] for d in range(3) if d != s and (not self.pegs[d] or self.pegs[d][-1] > self.pegs[s][-1])]

    def random_move(self) -> str:
        moves = self.legal_moves()
        src, dst = moves[int(self.np_random.integers(len(moves)))]
        return f"{PEGS[src]} {PEGS[dst]}"

    def oracle_move(self) -> str:
        """The first move of the shortest solution from the current position (any legal position)."""
        where = [0] * (self.num_disks + 1)  # peg of each disk
        for index, peg in enumerate(self.pegs):
            for disk in peg:
                where[disk] = index
        target = 2
        # The largest disk not yet on its target decides: clear the smaller ones onto the spare peg,
        # then move it. Recursing on the smaller disks with the spare as their target gives the move.
        for disk in range(self.num_disks, 0, -1):
            if where[disk] == target:
                continue
            spare = 3 - where[disk] - target
            if all(where[smaller] == spare for smaller in range(1, disk)):
                return f"{PEGS[where[disk]]} {PEGS[target]}"
            target = spare
        raise RuntimeError("oracle_move called on a solved position")  # unreachable while the episode runs
