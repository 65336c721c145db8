"""Crosswords: fill a small generated crossword from its clues.

Clues. GEM ships a clue data set; we do not have it and do not download one. Instead this package
ships ``gem_core/data/crossword_clues.tsv``: about 230 short definition clues written for this
project (our own text, ~10 KB), each answer a word of the ``common`` tier of
``gem_core.utils.words``. They are split in two levels, like GEM's: ``basic`` (everyday words) and
``hard`` (less common words). We chose hand-written definitions over clues generated from the word
itself (letter patterns, anagrams): a crossword is a test of knowing words from their meaning, and
generated clues would turn it into a dictionary search. The price is a small answer pool.

Grid. Answers are laid out by crossing letters, with the usual crossword rule that no two letters
touch unless they belong to the same answer (so no stray letter runs); an answer that cannot cross
any placed one is put apart, below the rest.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import ClassVar, NamedTuple

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo, echo_bare
from gem_core.envs.games.word_search import render_grid

ACROSS, DOWN = "across", "down"
_STEP = {ACROSS: (0, 1), DOWN: (1, 0)}
HIDDEN, BLOCK = "_", "."
LEVELS = ("basic", "hard")


class Clue(NamedTuple):
    """One answer of the puzzle: its number, where it starts, which way it runs, and its clue."""

    number: int
    direction: str
    row: int
    col: int
    answer: str
    clue: str

    def cells(self) -> list[tuple[int, int]]:
        """The grid cells of the answer, first letter first."""
        dr, dc = _STEP[self.direction]
        return [(self.row + i * dr, self.col + i * dc) for i in range(len(self.answer))]


@cache
def clue_bank(level: str) -> tuple[tuple[str, str], ...]:
    """The (answer, clue) pairs of a level, from the shipped clue file, in file order; each answer
    once (the first clue given for it), so that drawing answers until enough are distinct ends."""
    if level not in LEVELS:
        raise ValueError(f"clue level must be one of {LEVELS}, got {level!r}")
    text = resources.files("gem_core").joinpath("data/crossword_clues.tsv").read_text(encoding="utf-8")
    pairs, seen = [], set()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        row_level, answer, clue = line.split("\t")
        if row_level == level and answer not in seen:
            seen.add(answer)
            pairs.append((answer, clue))
    return tuple(pairs)


def _fits(letters: dict, same_way: set, word: str, row: int, col: int, dr: int, dc: int) -> bool:
    """Whether ``word`` can go at (row, col), running (dr, dc), without breaking the crossword rules.
    ``same_way``: the cells that an answer running the same way already uses."""
    if (row - dr, col - dc) in letters or (row + len(word) * dr, col + len(word) * dc) in letters:
        return False  # it would run on into another answer
    for letter in word:
        cell = (row, col)
        existing = letters.get(cell)
        if existing is not None:
            if existing != letter or cell in same_way:
                return False
        elif (row + dc, col + dr) in letters or (row - dc, col - dr) in letters:
            return False  # a side neighbour would make a letter run that is no answer
        row += dr
        col += dc
    return True


def layout(answers: list[str], randbelow: Callable[[int], int]) -> list[tuple[str, int, int, str]]:
    """Place ``answers`` (longest first) as a crossword: (answer, row, col, direction), rows and
    columns counted from 0 at the top-left of the used area. ``randbelow(n)`` draws an int in
    ``[0, n)``: it picks the first answer's direction and each crossing among those that fit."""
    order = sorted(answers, key=len, reverse=True)
    letters: dict[tuple[int, int], str] = {}
    used: dict[str, set[tuple[int, int]]] = {ACROSS: set(), DOWN: set()}  # cells per direction
    placed: list[tuple[str, int, int, str]] = []

    def put(word: str, row: int, col: int, direction: str) -> None:
        dr, dc = _STEP[direction]
        cells = [(row + i * dr, col + i * dc) for i in range(len(word))]
        letters.update(zip(cells, word))
        used[direction].update(cells)
        placed.append((word, row, col, direction))

    put(order[0], 0, 0, ACROSS if randbelow(2) == 0 else DOWN)
    for word in order[1:]:
        # Every start where a letter of word would cross the same letter of a placed answer (a dict:
        # unique and in a fixed order, so the draw is reproducible).
        crossings: dict[tuple[int, int, str], None] = {}
        for other, prow, pcol, pdir in placed:
            new_dir = DOWN if pdir == ACROSS else ACROSS
            pdr, pdc = _STEP[pdir]
            ndr, ndc = _STEP[new_dir]
            for j, shared in enumerate(other):
                i = word.find(shared)
                while i >= 0:
                    crossings[(prow + j * pdr - i * ndr, pcol + j * pdc - i * ndc, new_dir)] = None
                    i = word.find(shared, i + 1)
        # Draw crossings without replacement until one fits: the same as a uniform draw among those
        # that fit, without testing them all.
        choices = list(crossings)
        while choices:
            k = randbelow(len(choices))
            row, col, direction = choices[k]
            dr, dc = _STEP[direction]
            if _fits(letters, used[direction], word, row, col, dr, dc):
                put(word, row, col, direction)
                break
            choices[k] = choices[-1]
            choices.pop()
        else:  # no crossing possible: a separate answer two rows below everything
            bottom = max(r + (len(w) - 1 if d == DOWN else 0) for w, r, _, d in placed)
            put(word, bottom + 2, min(c for _, _, c, _ in placed), ACROSS)
    # Answers run right or down, so the first cells hold the smallest row and column.
    top = min(r for _, r, _, _ in placed)
    left = min(c for _, _, c, _ in placed)
    return [(word, row - top, col - left, direction) for word, row, col, direction in placed]


def _as_int(token: str) -> int | None:
    try:
        return int(token)
    except ValueError:
        return None


class Crosswords(TextGame):
    """Fill a crossword of ``num_words`` answers within ``max_turns`` moves.

    A move fills one cell, ``row col letter`` (GEM's move, e.g. ``\\boxed{0 2 a}``), or one whole
    answer, ``number word`` (e.g. ``\\boxed{2 apple}``). A wrong letter or word is rejected and the
    cells stay empty. ``hardcore`` draws from the ``hard`` clue level, otherwise from ``basic``.
    Rewards: each newly filled cell pays ``0.5 / letter_cells``; the move that completes the grid
    pays the rest, so a solved puzzle returns exactly 1.0 and an unsolved one at most 0.5 (GEM
    pays all of it per cell; we keep half for solving). Wrong letters and words pay 0. Moves out of
    the grid, on a black square or a filled cell, answers of the wrong length, repeats of a wrong
    guess and unreadable moves are invalid (reward 0, turn used).
    All three settings ``None``: 2-4 answers of a random level, and one turn per letter cell plus
    one per answer.
    """

    title = "Crosswords"
    progress_share = 0.5

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "num_words": Param(int, low=1, high=10, none="drawn per episode"),
        "hardcore": Param(bool, none="drawn per episode"),
    }

    def __init__(self, num_words: int | None = 5, hardcore: bool | None = False, max_turns: int | None = 100):
        check_args(type(self), {"num_words": num_words, "hardcore": hardcore, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._num_words_arg = num_words
        self._hardcore_arg = hardcore
        self.num_words = num_words or 3
        self.hardcore = bool(hardcore)
        self.clues: list[Clue] = []
        self.solution: list[str] = []
        self.board: list[list[str]] = []
        self.letter_cells = 0
        self.filled = 0
        self.tried: set[str] = set()  # wrong guesses so far, so a repeat is flagged
        self.progress_paid = 0.0

    def new_game(self) -> None:
        randbelow = self._randbelow
        self.num_words = self._randint(2, 4) if self._num_words_arg is None else self._num_words_arg
        self.hardcore = bool(randbelow(2)) if self._hardcore_arg is None else bool(self._hardcore_arg)
        bank = clue_bank("hard" if self.hardcore else "basic")
        # Distinct answers drawn on the buffered uniforms, redrawing a repeat (a handful from ~100):
        # far cheaper than Generator.choice(replace=False), which permutes the whole bank.
        count = min(self.num_words, len(bank))
        clue_of: dict[str, str] = {}
        while len(clue_of) < count:
            answer, clue = bank[randbelow(len(bank))]
            clue_of.setdefault(answer, clue)
        placed = layout(list(clue_of), randbelow)
        rows = 1 + max(r + (len(w) - 1 if d == DOWN else 0) for w, r, _, d in placed)
        cols = 1 + max(c + (len(w) - 1 if d == ACROSS else 0) for w, _, c, d in placed)
        solution = [[BLOCK] * cols for _ in range(rows)]
        # Number the answers in reading order of their first cell, as printed crosswords do.
        placed.sort(key=lambda p: (p[1], p[2], p[3]))
        self.clues = [Clue(n, d, r, c, w, clue_of[w]) for n, (w, r, c, d) in enumerate(placed, start=1)]
        for word, r, c, direction in placed:
            if direction == ACROSS:
                solution[r][c : c + len(word)] = word
            else:
                for i, letter in enumerate(word):
                    solution[r + i][c] = letter
        self.solution = ["".join(row) for row in solution]
        self.board = [list(row.translate(_HIDE_LETTERS)) for row in self.solution]
        self.letter_cells = rows * cols - sum(row.count(BLOCK) for row in self.solution)
        self.filled = 0
        self.tried = set()
        self.progress_paid = 0.0
        if self._max_turns_arg is None:
            self.max_turns = self.letter_cells + self.num_words

    # -- text ------------------------------------------------------------------------------------
    def render(self) -> str:
        """The grid as text: letters found, ``_`` for empty cells, ``.`` for black squares."""
        return render_grid(self.board)

    def clue_list(self) -> str:
        """The numbered clues with where each answer starts, which way it runs and its length."""
        return "\n".join(f"{c.number}. {c.direction}, from row {c.row} col {c.col}, {len(c.answer)} letters: {c.clue}" for c in self.clues)

    def state_text(self) -> str:
        return self.render()

    def instructions(self) -> str:
        first = self.clues[0]
        return (
            "You are playing Crosswords.\n"
            f"Fill every empty cell (_) of the grid within {self.max_turns} turns; '.' marks a black square.\n"
            "Rows and columns are numbered from 0. Each turn, make one move inside \\boxed{}:\n"
            f"  fill one cell with 'row col letter', for example \\boxed{{{first.row} {first.col} a}};\n"
            "  or fill a whole answer with 'clue-number word', for example \\boxed{2 yellow}.\n"
            "A wrong letter or word is rejected and the cells stay empty.\n"
            f"Clues:\n{self.clue_list()}"  # the grid follows in every task_suffix
        )

    def task_suffix(self) -> str:
        return f"Current grid:\n{self.render()}\nEnter your next move."

    # -- moves -----------------------------------------------------------------------------------
    def play(self, move: str) -> Move:
        tokens = move.translate(_STRIP).replace(",", " ").split()
        if len(tokens) == 3:
            row, col, letter = _as_int(tokens[0]), _as_int(tokens[1]), tokens[2].lower()
            if row is not None and col is not None and len(letter) == 1 and letter.isascii() and letter.isalpha():
                return self._fill_cell(row, col, letter)
        elif len(tokens) == 2:
            number, word = _as_int(tokens[0]), tokens[1].lower()
            if number is not None and word.isascii() and word.isalpha():
                return self._fill_answer(number, word)
        return illegal(
            f"At turn {self.turn}, {echo(move)} is not a move. Write 'row col letter' (e.g. \\boxed{{0 2 a}}) "
            "or 'clue-number word' (e.g. \\boxed{2 yellow}).",
        )

    def _fill_cell(self, row: int, col: int, letter: str) -> Move:
        where = f"({echo_bare(row)}, {echo_bare(col)})"
        if not (0 <= row < len(self.board) and 0 <= col < len(self.board[0])):
            return illegal(f"At turn {self.turn}, {where} is outside the grid.")
        if self.board[row][col] == BLOCK:
            return illegal(f"At turn {self.turn}, {where} is a black square.")
        if self.board[row][col] != HIDDEN:
            return illegal(f"At turn {self.turn}, {where} is already filled.")
        key = f"{row} {col} {letter}"
        if key in self.tried:
            return illegal(f"At turn {self.turn}, you already tried {letter.upper()} at {where}.")
        if self.solution[row][col] != letter:
            self.tried.add(key)
            return moved(f"At turn {self.turn}, {letter.upper()} is not the letter at {where}.")
        self.board[row][col] = letter
        return self._progress(1, f"At turn {self.turn}, {letter.upper()} at {where} is right.")

    def _fill_answer(self, number: int, word: str) -> Move:
        if not 1 <= number <= len(self.clues):
            return illegal(f"At turn {self.turn}, there is no clue {echo_bare(number)}; clues are 1-{len(self.clues)}.")
        clue = self.clues[number - 1]
        if len(word) != len(clue.answer):
            return illegal(
                f"At turn {self.turn}, {echo_bare(word.upper())} has {len(word)} letters; answer {number} has {len(clue.answer)}.",
            )
        cells = clue.cells()
        if all(self.board[r][c] != HIDDEN for r, c in cells):
            return illegal(f"At turn {self.turn}, answer {number} is already complete.")
        key = f"{number} {word}"
        if key in self.tried:
            return illegal(f"At turn {self.turn}, you already tried {word.upper()} for clue {number}.")
        if word != clue.answer:
            self.tried.add(key)
            return moved(f"At turn {self.turn}, {word.upper()} is not the answer to clue {number}.")
        newly = 0
        for (r, c), letter in zip(cells, word):
            if self.board[r][c] == HIDDEN:
                self.board[r][c] = letter
                newly += 1
        return self._progress(newly, f"At turn {self.turn}, {word.upper()} is right for clue {number}.")

    def _progress(self, newly_filled: int, message: str) -> Move:
        self.filled += newly_filled
        if self.filled == self.letter_cells:
            reward = self.success_reward - self.progress_paid
            self.progress_paid = self.success_reward
            return won(f"{message} Congratulations! You completed the crossword in {self.turn} turns.", reward)
        reward = self.progress_share * newly_filled / self.letter_cells
        self.progress_paid += reward
        return moved(message, reward)

    def random_move(self) -> str:
        empty = [(r, c) for r, row in enumerate(self.board) for c, ch in enumerate(row) if ch == HIDDEN]
        if not empty:  # only after a win; any well-formed move will do
            return "0 0 a"
        r, c = empty[self._randbelow(len(empty))]
        return f"{r} {c} {chr(ord('a') + self._randbelow(26))}"

    def oracle_move(self) -> str:
        """Reads the solution: the first answer that still has empty cells."""
        for clue in self.clues:
            if any(self.board[r][c] == HIDDEN for r, c in clue.cells()):
                return f"{clue.number} {clue.answer}"
        return f"1 {self.clues[0].answer}"


_STRIP = str.maketrans("", "", "[]()")
_HIDE_LETTERS = str.maketrans(string.ascii_lowercase, HIDDEN * len(string.ascii_lowercase))
