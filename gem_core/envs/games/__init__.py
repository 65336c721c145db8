"""The game suite: ids, variants and default settings (GEM's ids and sizes).

Each game has ``-v0-easy``, ``-v0-hard`` and ``-v0-random`` variants (``None`` settings are drawn per
episode), and a plain ``-v0`` id with the class defaults, which is the id the GEM paper's examples use.
Modules are imported only when an env is made.
"""

from __future__ import annotations

from typing import Any

from gem_core.registry import register

_GAMES: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "GuessTheNumber": (
        "guess_the_number:GuessTheNumber",
        {
            "easy": dict(min_number=1, max_number=10, max_turns=4),
            "hard": dict(min_number=1, max_number=50, max_turns=7),
            "random": dict(min_number=None, max_number=None, max_turns=None),
        },
    ),
    "Mastermind": (
        "mastermind:Mastermind",
        {
            "easy": dict(code_length=2, num_numbers=6, max_turns=10, duplicate_numbers=False),
            "hard": dict(code_length=4, num_numbers=8, max_turns=30, duplicate_numbers=False),
            "random": dict(code_length=None, num_numbers=None, max_turns=None, duplicate_numbers=False),
        },
    ),
    "Minesweeper": (
        "minesweeper:Minesweeper",
        {
            "easy": dict(rows=5, cols=5, num_mines=5, max_turns=25),
            "hard": dict(rows=8, cols=8, num_mines=12, max_turns=64),
            "random": dict(rows=None, cols=None, num_mines=None, max_turns=None),
        },
    ),
    "Wordle": (
        "wordle:Wordle",
        {
            "easy": dict(word_length=3, max_turns=15),
            "hard": dict(word_length=5, max_turns=25),
            "random": dict(word_length=None, max_turns=None),
        },
    ),
    "Hangman": (
        "hangman:Hangman",
        {
            "easy": dict(word_length=3, max_turns=10),
            "hard": dict(word_length=7, max_turns=20),
            "random": dict(word_length=None, max_turns=None),
        },
    ),
    "Sudoku": (
        "sudoku:Sudoku",
        {
            "easy": dict(scale=4, clues=10, max_turns=15),
            "hard": dict(scale=9, clues=50, max_turns=50),
            "random": dict(scale=None, clues=None, max_turns=None),
        },
    ),
    "TowerofHanoi": (
        "tower_of_hanoi:TowerOfHanoi",
        {
            "easy": dict(num_disks=3, max_turns=10),
            "hard": dict(num_disks=5, max_turns=35),
            "random": dict(num_disks=None, max_turns=None),
        },
    ),
    "FifteenPuzzle": (
        "fifteen_puzzle:FifteenPuzzle",
        {
            "easy": dict(num_rows=2, max_turns=10),
            "hard": dict(num_rows=4, max_turns=50),
            "random": dict(num_rows=None, max_turns=None),
        },
    ),
    "Game2048": (
        "game_2048:Game2048",
        {
            "easy": dict(target_tile=64, max_turns=50),
            "hard": dict(target_tile=512, max_turns=50),
            "extreme-hard": dict(target_tile=2048, max_turns=100),
            "random": dict(target_tile=None, max_turns=None),
        },
    ),
    "Sokoban": (
        "sokoban:Sokoban",
        {
            "easy": dict(dim_room=(6, 6), num_boxes=2, max_turns=20),
            "hard": dict(dim_room=(8, 8), num_boxes=4, max_turns=50),
            "random": dict(dim_room=None, num_boxes=None, max_turns=None),
        },
    ),
    "Crosswords": (
        "crosswords:Crosswords",
        {
            "easy": dict(num_words=3, hardcore=False, max_turns=30),
            "hard": dict(num_words=3, hardcore=True, max_turns=40),
            "random": dict(num_words=None, hardcore=None, max_turns=None),
        },
    ),
    "WordSearch": (
        "word_search:WordSearch",
        {
            "easy": dict(num_words=5, hardcore=False, max_turns=20),
            "hard": dict(num_words=5, hardcore=True, max_turns=20),
            "random": dict(num_words=None, hardcore=None, max_turns=None),
        },
    ),
}

GAME_NAMES = tuple(_GAMES)


def _register_games() -> None:
    for name, (entry, variants) in _GAMES.items():
        entry_point = f"gem_core.envs.games.{entry}"
        register(f"game:{name}-v0", entry_point, description=f"{name} with the class defaults")
        for variant, kwargs in variants.items():
            register(f"game:{name}-v0-{variant}", entry_point, description=f"{name}, {variant}", **kwargs)


_register_games()
