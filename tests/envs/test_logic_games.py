"""Mastermind, Minesweeper and Sudoku: rules, rewards, solvability and determinism.

Solvability is checked with solvers written here (for Sudoku, one that never reads the stored
solution), so a generator bug cannot hide behind the game's own helpers.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

import gem_core
from gem_core.envs.games.mastermind import RANDOM_SETTINGS as MASTERMIND_SETTINGS
from gem_core.envs.games.mastermind import Mastermind, score_guess
from gem_core.envs.games.minesweeper import Minesweeper
from gem_core.envs.games.sudoku import Sudoku, solve_sudoku

SEEDS = range(50)


def boxed(move: str) -> str:
    return "\\boxed{" + move + "}"


def play_oracle(env) -> tuple[list[float], dict, int]:
    """Play the oracle to the end; returns the rewards, the last info and the number of turns."""
    game = env.unwrapped
    rewards = []
    for turn in range(1, game.max_turns + 1):
        _, reward, terminated, truncated, info = env.step(game.oracle_action())
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info, turn
    raise AssertionError("episode did not end within max_turns")


# ================================================================================================
# Mastermind
# ================================================================================================


def reference_pegs(secret, guess):
    """Black/white pegs by the textbook definition (per-digit minimum of the counts)."""
    black = sum(s == g for s, g in zip(secret, guess))
    shared = sum((Counter(secret) & Counter(guess)).values())
    return black, shared - black


@pytest.mark.parametrize(
    "secret, guess, pegs",
    [
        ((1, 2, 3, 4), (1, 2, 3, 4), (4, 0)),
        ((1, 2, 3, 4), (4, 3, 2, 1), (0, 4)),
        ((1, 2, 3, 4), (5, 6, 5, 6), (0, 0)),
        ((1, 2, 3, 4), (1, 1, 1, 1), (1, 0)),  # a repeated guess digit matches the code's one 1 once
        ((1, 1, 2, 3), (1, 1, 1, 1), (2, 0)),
        ((1, 1, 2, 2), (1, 2, 1, 2), (2, 2)),
        ((2, 2, 1, 1), (1, 1, 1, 2), (1, 2)),  # three 1s in the guess, two in the code
        ((1, 2, 2, 2), (2, 1, 1, 1), (0, 2)),
        ((3, 3), (3, 1), (1, 0)),  # the black 3 is not also counted white
    ],
)
def test_mastermind_peg_counting_with_duplicates(secret, guess, pegs):
    assert score_guess(secret, guess) == pegs


def test_mastermind_pegs_match_the_textbook_definition_exhaustively():
    codes = list(itertools.product(range(1, 4), repeat=4))
    for secret in codes:
        for guess in codes:
            assert score_guess(secret, guess) == reference_pegs(secret, guess)


def make_mastermind(secret, **kwargs) -> Mastermind:
    game = Mastermind(**kwargs)
    game.reset(seed=0)
    game.secret = tuple(secret)
    return game


def test_mastermind_dense_reward_counts_only_new_black_pegs():
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=6, max_turns=20)
    steps = [("1 2 5 6", 0.5), ("1 5 6 2", 0.0), ("2 1 4 3", 0.0), ("1 2 3 5", 0.25)]
    for guess, expected in steps:
        obs, reward, terminated, truncated, info = game.step(boxed(guess))
        assert reward == pytest.approx(expected), guess
        assert not terminated and not truncated and not info["invalid_action"]
    assert "3 black peg(s) and 0 white peg(s)" in obs
    obs, reward, terminated, truncated, info = game.step(boxed("1 2 3 4"))
    assert terminated and info["success"] and not truncated
    assert reward == pytest.approx(0.25)
    assert 0.5 + 0.25 + 0.25 == pytest.approx(1.0)  # a solved game's rewards add up to 1


def test_mastermind_first_guess_right_earns_one():
    game = make_mastermind((3, 1), code_length=2, num_numbers=6, max_turns=10)
    _, reward, terminated, _, info = game.step(boxed("3 1"))
    assert terminated and info["success"] and reward == pytest.approx(1.0)


@pytest.mark.parametrize(
    "move, phrase",
    [
        ("1 2 3", "has 3 digits"),
        ("1 2 3 4 5", "has 5 digits"),
        ("1 2 3 7", "outside 1 to 6"),
        ("0 1 2 3", "outside 1 to 6"),
        ("a b c d", "not a list of digits"),
        ("1.5 2 3 4", "not a list of digits"),
    ],
)
def test_mastermind_invalid_guesses_cost_a_turn_but_no_penalty(move, phrase):
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=6, max_turns=20)
    obs, reward, terminated, truncated, info = game.step(boxed(move))
    assert phrase in obs
    assert reward == 0.0 and info["invalid_action"] and not info["format_error"]
    assert not terminated and not truncated and game.turn == 1 and game.history == []


def test_mastermind_accepts_commas_and_compact_digits():
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=6, max_turns=20)
    assert not game.step(boxed("1, 2, 5, 6"))[4]["invalid_action"]
    assert game.step(boxed("2156"))[4]["black_pegs"] == 0
    assert [g for g, _, _ in game.history] == [(1, 2, 5, 6), (2, 1, 5, 6)]


@pytest.mark.parametrize(
    "move, guess",
    [
        ("1 2 5 6", (1, 2, 5, 6)),  # the fast path: canonical digits
        ("01 2 5 6", (1, 2, 5, 6)),  # leading zero: the careful path reads it
        ("1\t2\n5  6", (1, 2, 5, 6)),  # any whitespace separates
        (" ,1,2 ,5, 6, ", (1, 2, 5, 6)),
        ("\u0661 \u0662 \u0665 \u0666", None),  # Arabic-Indic digits: int() reads them, a code does not
        ("1 2 5 6 ", (1, 2, 5, 6)),
        ("12 5 6", None),
    ],
)
def test_mastermind_reads_a_guess_the_same_on_either_path(move, guess):
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=6, max_turns=20)
    obs, _, _, _, info = game.step(boxed(move))
    if guess is None:
        assert info["invalid_action"] and game.history == []
    else:
        assert not info["invalid_action"] and game.history[0][0] == guess
        assert "you guessed 1 2 5 6:" in obs  # shown canonically, whatever was written


def test_mastermind_repeated_guess_is_invalid():
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=6, max_turns=20)
    game.step(boxed("1 2 5 6"))
    obs, reward, terminated, _, info = game.step(boxed("1 2 5 6"))
    assert info["invalid_action"] and reward == 0.0 and not terminated and "again" in obs


def test_mastermind_time_limit_truncates_and_reveals_the_code():
    game = make_mastermind((1, 2), code_length=2, num_numbers=6, max_turns=2)
    game.step(boxed("3 4"))
    obs, reward, terminated, truncated, info = game.step(boxed("5 6"))
    assert truncated and not terminated and not info["success"] and reward == 0.0
    assert "maximum number of turns" in obs and "1 2" in obs


def test_mastermind_secret_respects_duplicate_setting():
    distinct = Mastermind(code_length=4, num_numbers=6, max_turns=20, duplicate_numbers=False)
    repeats = Mastermind(code_length=4, num_numbers=6, max_turns=20, duplicate_numbers=True)
    saw_repeat = False
    for seed in SEEDS:
        distinct.reset(seed=seed)
        repeats.reset(seed=seed)
        assert len(set(distinct.secret)) == 4
        assert all(1 <= d <= 6 for d in distinct.secret + repeats.secret)
        saw_repeat |= len(set(repeats.secret)) < 4
    assert saw_repeat


def test_mastermind_rejects_impossible_settings():
    with pytest.raises(ValueError, match="distinct"):
        Mastermind(code_length=5, num_numbers=4, max_turns=10, duplicate_numbers=False)
    with pytest.raises(ValueError):
        Mastermind(code_length=0, num_numbers=4, max_turns=10)


def test_mastermind_random_variant_draws_from_the_table():
    env = gem_core.make("game:Mastermind-v0-random")
    seen = set()
    for seed in SEEDS:
        env.reset(seed=seed)
        game = env.unwrapped
        seen.add((game.code_length, game.num_numbers, game.max_turns))
    assert seen == set(MASTERMIND_SETTINGS)


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_mastermind_solver_wins_every_seed(variant):
    env = gem_core.make(f"game:Mastermind-v0-{variant}")
    for seed in SEEDS:
        env.reset(seed=seed)
        rewards, info, _ = play_oracle(env)
        assert info["success"], f"seed {seed}"
        assert sum(rewards) == pytest.approx(1.0)


@pytest.mark.parametrize("length, numbers", [(4, 6), (3, 5)])
def test_mastermind_solver_wins_with_duplicate_digits(length, numbers):
    game = Mastermind(code_length=length, num_numbers=numbers, max_turns=10, duplicate_numbers=True)
    for seed in range(20):
        game.reset(seed=seed)
        _, info, _ = play_oracle(game)
        assert info["success"], f"seed {seed}"


def test_mastermind_solver_uses_only_the_feedback():
    game = make_mastermind((1, 2, 3, 4), code_length=4, num_numbers=8, max_turns=30)
    first = game.oracle_move()
    game.secret = (8, 7, 6, 5)
    assert game.oracle_move() == first, "with no feedback yet, the secret must not matter"
    for _ in range(game.max_turns):
        guess = tuple(int(d) for d in game.oracle_move().split())
        # Every guess could still be the code, given all the pegs seen so far.
        assert all(score_guess(guess, old) == (black, white) for old, black, white in game.history)
        _, _, terminated, _, _ = game.step(boxed(" ".join(map(str, guess))))
        if terminated:
            break
    assert game.history[-1][0] == (8, 7, 6, 5)


def test_mastermind_consistent_codes_always_contain_the_secret():
    game = Mastermind(code_length=4, num_numbers=6, max_turns=20)
    game.reset(seed=3)
    assert len(game.consistent_codes()) == 6 * 5 * 4 * 3
    for guess in ["1 2 3 4", "2 3 4 5", "6 5 4 3"]:
        game.step(boxed(guess))
        codes = {tuple(row) for row in game.consistent_codes().tolist()}
        assert game.secret in codes
        assert all(reference_pegs(code, g) == (b, w) for code in codes for g, b, w in game.history)


# ================================================================================================
# Minesweeper
# ================================================================================================


def mines_of(game: Minesweeper) -> set[tuple[int, int]]:
    return {divmod(i, game.cols) for i, mine in enumerate(game.is_mine) if mine}


def rigged_minesweeper(rows: int, cols: int, mines: list[tuple[int, int]], max_turns: int = 50) -> Minesweeper:
    """A game whose mines will be exactly ``mines`` (the cells drawn first at reset), as long as the
    first reveal is not next to them."""
    game = Minesweeper(rows=rows, cols=cols, num_mines=len(mines), max_turns=max_turns)
    game.reset(seed=0)
    chosen = [r * cols + c for r, c in mines]
    game.mine_order = chosen + [i for i in game.mine_order if i not in chosen]
    return game


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_minesweeper_first_reveal_is_never_a_mine(variant):
    env = gem_core.make(f"game:Minesweeper-v0-{variant}")
    for seed in SEEDS:
        env.reset(seed=seed)
        game = env.unwrapped
        row, col = seed % game.rows, (seed * 7) % game.cols  # corners, edges and middles
        _, reward, _, _, info = env.step(boxed(f"reveal {row} {col}"))
        assert not info["invalid_action"] and reward > 0
        assert len(mines_of(game)) == game.num_mines
        clear = {(r, c) for r in range(row - 1, row + 2) for c in range(col - 1, col + 2)}
        assert not mines_of(game) & clear, "the first reveal and its neighbours stay mine-free"
        assert game.adjacent[row * game.cols + col] == 0


def test_minesweeper_first_reveal_is_safe_on_a_crowded_board():
    for seed in range(20):
        game = Minesweeper(rows=3, cols=3, num_mines=8, max_turns=5)
        game.reset(seed=seed)
        _, reward, terminated, _, info = game.step(boxed("reveal 1 1"))
        assert terminated and info["success"] and reward == pytest.approx(1.0)
        assert (1, 1) not in mines_of(game)


def test_minesweeper_flood_fill_stops_at_numbers():
    # A wall of mines down column 2 of a 5x5 board: revealing the top-right corner opens columns 3-4 only.
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    obs, reward, terminated, _, _ = game.step(boxed("reveal 0 4"))
    assert mines_of(game) == {(r, 2) for r in range(5)}
    revealed = {divmod(i, 5) for i, shown in enumerate(game.revealed) if shown}
    assert revealed == {(r, c) for r in range(5) for c in (3, 4)}
    assert [game.adjacent[r * 5 + 3] for r in range(5)] == [2, 3, 3, 3, 2]
    assert reward == pytest.approx(10 / 20) and not terminated
    assert "uncovering 10 cell(s)" in obs
    assert game.render_board().splitlines()[1].split() == ["0", ".", ".", ".", "2", "0"]


def test_minesweeper_flood_fill_skips_flagged_cells():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    game.step(boxed("flag 4 4"))
    _, reward, _, _, info = game.step(boxed("reveal 0 4"))
    assert not game.revealed[4 * 5 + 4] and game.flagged[4 * 5 + 4]
    assert reward == pytest.approx(9 / 20)
    assert "F" in info["suffix"]


def test_minesweeper_one_reveal_can_win():
    game = rigged_minesweeper(4, 4, [(0, 0)])
    obs, reward, terminated, truncated, info = game.step(boxed("reveal 3 3"))
    assert terminated and not truncated and info["success"]
    assert reward == pytest.approx(1.0)
    assert "Congratulations" in obs


def test_minesweeper_hitting_a_mine_loses():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    game.step(boxed("reveal 0 4"))
    obs, reward, terminated, truncated, info = game.step(boxed("reveal 3 2"))
    assert terminated and not truncated and not info["success"]
    assert reward == 0.0
    assert "mine" in obs
    assert info["suffix"].count("*") == 5  # the lost board shows every mine


def test_minesweeper_win_needs_no_flags_and_rewards_sum_to_one():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    _, first, terminated, _, _ = game.step(boxed("reveal 0 4"))  # opens columns 3-4
    assert not terminated
    _, second, terminated, truncated, info = game.step(boxed("reveal 0 0"))  # a zero: opens columns 0-1
    assert terminated and not truncated and info["success"]
    assert not any(game.flagged)
    assert first + second == pytest.approx(1.0)


def test_minesweeper_flags_toggle_and_earn_nothing():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    obs, reward, terminated, _, info = game.step(boxed("flag 0 2"))
    assert game.flagged[2] and reward == 0.0 and not terminated and not info["invalid_action"]
    assert "placed a flag" in obs and info["suffix"].splitlines()[2].split()[3] == "F"
    obs, reward, _, _, _ = game.step(boxed("flag 0 2"))
    assert not game.flagged[2] and reward == 0.0 and "removed the flag" in obs


@pytest.mark.parametrize(
    "setup, move, phrase",
    [
        ([], "reveal 5 0", "off the board"),
        ([], "reveal -1 0", "off the board"),
        ([], "dig 1 1", "not a move"),
        ([], "reveal 1", "not a move"),
        ([], "reveal a b", "whole numbers"),
        (["reveal 0 4"], "reveal 0 4", "already revealed"),
        (["reveal 0 4"], "flag 1 4", "already revealed"),
        (["flag 1 1"], "reveal 1 1", "remove the flag"),
    ],
)
def test_minesweeper_invalid_moves(setup, move, phrase):
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    for earlier in setup:
        game.step(boxed(earlier))
    before = (list(game.revealed), list(game.flagged))
    obs, reward, terminated, truncated, info = game.step(boxed(move))
    assert phrase in obs and info["invalid_action"] and reward == 0.0
    assert not terminated and not truncated
    assert (game.revealed, game.flagged) == before


def test_minesweeper_moves_are_case_and_separator_tolerant():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    _, reward, _, _, info = game.step(boxed("Reveal (0, 4)"))
    assert not info["invalid_action"] and reward == pytest.approx(0.5)


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_minesweeper_oracle_clears_every_seed(variant):
    env = gem_core.make(f"game:Minesweeper-v0-{variant}")
    for seed in SEEDS:
        env.reset(seed=seed)
        rewards, info, _ = play_oracle(env)
        assert info["success"], f"seed {seed}"
        assert sum(rewards) == pytest.approx(1.0)


def test_minesweeper_oracle_unflags_a_safe_cell_when_it_must():
    game = rigged_minesweeper(5, 5, [(r, 2) for r in range(5)])
    game.step(boxed("reveal 0 4"))
    for row in range(5):
        for col in (0, 1):
            game.step(boxed(f"flag {row} {col}"))  # wrong flags on every safe cell left
    assert game.oracle_move() == "flag 0 0"
    _, info, _ = play_oracle(game)
    assert info["success"]


def test_minesweeper_board_does_not_depend_on_rng_use_before_the_first_reveal():
    a, b = Minesweeper(rows=8, cols=8, num_mines=12, max_turns=64), Minesweeper(rows=8, cols=8, num_mines=12, max_turns=64)
    a.reset(seed=11)
    b.reset(seed=11)
    for _ in range(5):
        b.sample_random_action()  # draws from b's RNG only
    a.step(boxed("reveal 4 4"))
    b.step(boxed("reveal 4 4"))
    assert mines_of(a) == mines_of(b)


def test_minesweeper_random_variant_sizes():
    env = gem_core.make("game:Minesweeper-v0-random")
    sizes = set()
    for seed in SEEDS:
        env.reset(seed=seed)
        game = env.unwrapped
        assert game.rows == game.cols and 5 <= game.rows <= 8
        assert game.num_mines == game.rows**2 // 5 and game.max_turns == game.rows**2
        sizes.add(game.rows)
    assert sizes == {5, 6, 7, 8}


def test_minesweeper_rejects_too_many_mines():
    with pytest.raises(ValueError, match="safe cell"):
        Minesweeper(rows=3, cols=3, num_mines=9, max_turns=5)


# ================================================================================================
# Sudoku
# ================================================================================================


def grid_is_valid(grid: list[int], scale: int) -> bool:
    """Every row, column and box holds 1..scale exactly once."""
    box = math.isqrt(scale)
    digits = list(range(1, scale + 1))
    rows = [grid[r * scale : (r + 1) * scale] for r in range(scale)]
    cols = [grid[c::scale] for c in range(scale)]
    boxes = [[grid[(top + r) * scale + left + c] for r in range(box) for c in range(box)] for top in range(0, scale, box) for left in range(0, scale, box)]
    return all(sorted(unit) == digits for unit in rows + cols + boxes)


def independent_solve(cells: list[int], scale: int) -> list[int] | None:
    """Plain backtracking with sets, most-constrained cell first. Written separately from the game's solver."""
    box = math.isqrt(scale)
    grid = list(cells)

    def allowed(i: int) -> set[int]:
        r, c = divmod(i, scale)
        top, left = r - r % box, c - c % box
        used = set(grid[r * scale : (r + 1) * scale]) | set(grid[c::scale])
        used |= {grid[(top + dr) * scale + left + dc] for dr in range(box) for dc in range(box)}
        return set(range(1, scale + 1)) - used

    def search() -> bool:
        empty = [i for i, d in enumerate(grid) if d == 0]
        if not empty:
            return True
        cell = min(empty, key=lambda i: len(allowed(i)))
        for digit in sorted(allowed(cell)):
            grid[cell] = digit
            if search():
                return True
        grid[cell] = 0
        return False

    for i, digit in enumerate(grid):  # the givens must not clash either
        if digit:
            grid[i] = 0
            ok = digit in allowed(i)
            grid[i] = digit
            if not ok:
                return None
    return grid if search() else None


def sudoku_cell(game: Sudoku, row: int, col: int) -> int:
    return game.board[(row - 1) * game.scale + col - 1]


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_sudoku_puzzles_are_solvable_without_the_stored_solution(variant):
    env = gem_core.make(f"game:Sudoku-v0-{variant}")
    for seed in SEEDS:
        env.reset(seed=seed)
        game = env.unwrapped
        assert grid_is_valid(game.solution, game.scale), "the full grid it started from is a real Sudoku"
        completion = independent_solve(game.board, game.scale)
        assert completion is not None, f"seed {seed}: puzzle has no solution"
        assert grid_is_valid(completion, game.scale)
        assert all(c == d for c, d in zip(completion, game.board) if d)


@pytest.mark.parametrize("scale, clues", [(4, 10), (9, 50), (9, 30), (4, 16), (9, 81)])
def test_sudoku_clues_is_the_number_of_emptied_cells(scale, clues):
    game = Sudoku(scale=scale, clues=clues, max_turns=100)
    for seed in range(10):
        game.reset(seed=seed)
        assert game.board.count(0) == clues == game.initial_empty
        assert sum(game.given) == scale * scale - clues


def test_sudoku_generator_varies_its_grids():
    game = Sudoku(scale=9, clues=50, max_turns=50)
    grids = set()
    for seed in SEEDS:
        game.reset(seed=seed)
        grids.add(tuple(game.solution))
    assert len(grids) == len(SEEDS)


def test_sudoku_game_solver_agrees_with_the_independent_one():
    for seed in range(20):
        game = Sudoku(scale=9, clues=60, max_turns=100)
        game.reset(seed=seed)
        completion = solve_sudoku(game.board, 9)
        assert completion is not None and grid_is_valid(completion, 9)
        assert all(c == d for c, d in zip(completion, game.board) if d)
    clashing = [1, 1] + [0] * 14
    assert solve_sudoku(clashing, 4) is None and independent_solve(clashing, 4) is None
    # No clash among the givens, yet no completion: cell (1, 1) needs a 1 that its column already has.
    dead_end = [0, 2, 3, 4] + [0] * 4 + [1] + [0] * 7
    assert solve_sudoku(dead_end, 4) is None and independent_solve(dead_end, 4) is None


def fresh_sudoku(seed: int = 4, scale: int = 4, clues: int = 10) -> Sudoku:
    game = Sudoku(scale=scale, clues=clues, max_turns=100)
    game.reset(seed=seed)
    return game


def test_sudoku_overwriting_a_clue_is_invalid():
    game = fresh_sudoku()
    row, col = next(divmod(i, 4) for i, g in enumerate(game.given) if g)
    digit = game.board[row * 4 + col]
    obs, reward, terminated, _, info = game.step(boxed(f"{row + 1} {col + 1} {digit % 4 + 1}"))
    assert info["invalid_action"] and reward == 0.0 and not terminated
    assert "given digit" in obs and sudoku_cell(game, row + 1, col + 1) == digit


def test_sudoku_overwriting_a_placed_digit_is_invalid():
    game = fresh_sudoku()
    move = game.oracle_move()
    assert game.step(boxed(move))[1] > 0
    row, col, digit = map(int, move.split())
    obs, reward, _, _, info = game.step(boxed(f"{row} {col} {digit % 4 + 1}"))
    assert info["invalid_action"] and reward == 0.0 and "you placed" in obs
    assert sudoku_cell(game, row, col) == digit


@pytest.mark.parametrize("unit", ["row", "column", "box"])
def test_sudoku_clashing_placements_are_invalid(unit):
    game = fresh_sudoku(scale=9, clues=50)
    units = {
        "row": lambda r, c, i: i // 9 == r,
        "column": lambda r, c, i: i % 9 == c,
        "box": lambda r, c, i: (i // 9) // 3 == r // 3 and (i % 9) // 3 == c // 3 and i // 9 != r and i % 9 != c,
    }
    for cell in range(81):
        if game.board[cell]:
            continue
        r, c = divmod(cell, 9)
        peers = [i for i in range(81) if i != cell and units[unit](r, c, i) and game.board[i]]
        # A digit from this unit that neither of the other two units holds, so the message names this one.
        others = [u for u in units if u != unit]
        for peer in peers:
            digit = game.board[peer]
            if not any(game.board[i] == digit for u in others for i in range(81) if i != cell and units[u](r, c, i)):
                obs, reward, _, _, info = game.step(boxed(f"{r + 1} {c + 1} {digit}"))
                assert info["invalid_action"] and reward == 0.0
                assert f"its {unit} already has a {digit}" in obs
                assert game.board[cell] == 0
                return
    pytest.fail(f"no clash in a {unit} found to test")


@pytest.mark.parametrize(
    "move, phrase",
    [("0 1 1", "between 1 and 4"), ("1 5 1", "between 1 and 4"), ("1 1 9", "between 1 and 4"), ("1 1", "not a move"), ("x y z", "not a move")],
)
def test_sudoku_malformed_moves_are_invalid(move, phrase):
    game = fresh_sudoku()
    obs, reward, terminated, _, info = game.step(boxed(move))
    assert phrase in obs and info["invalid_action"] and reward == 0.0 and not terminated


def test_sudoku_accepts_row_column_labels_and_commas():
    game = fresh_sudoku()
    row, col, digit = map(int, game.oracle_move().split())
    _, reward, _, _, info = game.step(boxed(f"R{row} C{col} {digit}"))
    assert not info["invalid_action"] and reward > 0
    row, col, digit = map(int, game.oracle_move().split())
    _, reward, _, _, info = game.step(boxed(f"{row},{col},{digit}"))
    assert not info["invalid_action"] and reward > 0


def test_sudoku_accepts_any_valid_completion():
    # An empty 4x4 grid: every valid grid completes it. Play one that is not the stored solution.
    game = fresh_sudoku(seed=2, clues=16)
    other = fresh_sudoku(seed=3, clues=16).solution
    assert other != game.solution
    rewards = []
    for cell, digit in enumerate(other):
        _, reward, terminated, _, info = game.step(boxed(f"{cell // 4 + 1} {cell % 4 + 1} {digit}"))
        assert not info["invalid_action"], f"cell {cell}"
        rewards.append(reward)
    assert terminated and info["success"]
    assert game.board == other
    assert sum(rewards) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(8))
def test_sudoku_accepts_a_move_exactly_when_a_completion_agrees_with_it(seed):
    game = fresh_sudoku(seed=seed, clues=12)
    game.step(boxed(game.oracle_move()))
    state = game.get_state()
    for cell in range(16):
        if game.board[cell]:
            continue
        for digit in range(1, 5):
            game.set_state(state)
            trial = list(game.board)
            trial[cell] = digit
            possible = independent_solve(trial, 4) is not None
            _, reward, _, _, info = game.step(boxed(f"{cell // 4 + 1} {cell % 4 + 1} {digit}"))
            assert (not info["invalid_action"]) == possible, (cell, digit)
            assert (reward > 0) == possible
            if possible:  # the stored completion follows the player's choice
                assert grid_is_valid(game.solution, 4)
                assert all(s == d for s, d in zip(game.solution, game.board) if d)


@pytest.mark.parametrize("seed", range(3))
def test_sudoku_9x9_walk_accepts_exactly_the_completable_moves(seed):
    """A long walk of random legal-looking moves on a hard 9x9 grid, through get_state/set_state and
    clone: each move is accepted exactly when the independent solver completes the grid with it (the
    game settles most moves from its cached propagation, so the cache must follow every change)."""
    game = Sudoku(scale=9, clues=55, max_turns=1000)
    game.reset(seed=seed)
    rng = np.random.default_rng(seed)
    accepted = 0
    for step in range(120):
        empty = [i for i, d in enumerate(game.board) if d == 0]
        if not empty:
            break
        cell, digit = int(rng.choice(empty)), int(rng.integers(1, 10))
        trial = list(game.board)
        trial[cell] = digit
        clash = any(trial[other] == digit for unit in _units_of(cell, 9) for other in unit if other != cell)
        possible = not clash and independent_solve(trial, 9) is not None
        if step % 7 == 3:
            game = game.clone()
        elif step % 7 == 5:
            state = game.get_state()
            game.reset(seed=seed + 100)  # a different grid in between
            game.set_state(state)
        _, reward, _, _, info = game.step(boxed(f"{cell // 9 + 1} {cell % 9 + 1} {digit}"))
        assert (not info["invalid_action"]) == possible, (step, cell, digit)
        accepted += possible
        assert grid_is_valid(game.solution, 9)
        assert all(s == d for s, d in zip(game.solution, game.board) if d)
    assert accepted >= 5  # the walk did place digits, not only rejections


def _units_of(cell: int, scale: int) -> list[list[int]]:
    box = math.isqrt(scale)
    r, c = divmod(cell, scale)
    top, left = r - r % box, c - c % box
    return [
        [r * scale + j for j in range(scale)],
        [i * scale + c for i in range(scale)],
        [(top + dr) * scale + left + dc for dr in range(box) for dc in range(box)],
    ]


def test_sudoku_rejects_a_dead_end_move_that_breaks_no_rule():
    game = fresh_sudoku(clues=16)  # an empty grid
    for move in ["1 2 2", "1 3 3", "1 4 4"]:
        assert game.step(boxed(move))[1] > 0
    # A 1 at row 3, column 1 clashes with nothing, but row 1 then has nowhere left for its 1.
    obs, reward, _, _, info = game.step(boxed("3 1 1"))
    assert info["invalid_action"] and reward == 0.0 and "impossible to complete" in obs
    assert game.board[8] == 0


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_sudoku_oracle_solves_every_seed_in_one_move_per_empty_cell(variant):
    env = gem_core.make(f"game:Sudoku-v0-{variant}")
    for seed in SEEDS:
        env.reset(seed=seed)
        empty = env.unwrapped.initial_empty
        rewards, info, turns = play_oracle(env)
        assert info["success"] and turns == empty, f"seed {seed}"
        assert all(r == pytest.approx(1 / empty) for r in rewards)
        assert sum(rewards) == pytest.approx(1.0)
        assert grid_is_valid(env.unwrapped.board, env.unwrapped.scale)


def test_sudoku_random_variant_settings():
    env = gem_core.make("game:Sudoku-v0-random")
    seen = set()
    for seed in SEEDS:
        env.reset(seed=seed)
        game = env.unwrapped
        seen.add((game.scale, game.initial_empty, game.max_turns))
    assert seen == {(4, 10, 15), (9, 50, 50)}


def test_sudoku_rejects_bad_settings():
    with pytest.raises(ValueError, match="scale=6 is not allowed: expected one of 4, 9"):
        Sudoku(scale=6, clues=10, max_turns=10)
    with pytest.raises(ValueError, match="between 1 and 16"):
        Sudoku(scale=4, clues=17, max_turns=10)


# ================================================================================================
# All three: determinism and state
# ================================================================================================

LOGIC_IDS = [f"game:{name}-v0-{variant}" for name in ("Mastermind", "Minesweeper", "Sudoku") for variant in ("easy", "hard", "random")]


def hidden_state(game) -> tuple:
    if isinstance(game, Mastermind):
        return game.secret, game.code_length, game.num_numbers, game.max_turns
    if isinstance(game, Minesweeper):
        return tuple(game.mine_order), game.rows, game.cols, game.num_mines, game.max_turns
    return tuple(game.board), tuple(game.solution), game.max_turns


@pytest.mark.parametrize("env_id", LOGIC_IDS)
def test_same_seed_same_game_different_seeds_differ(env_id):
    a, b = gem_core.make(env_id), gem_core.make(env_id)
    states = set()
    for seed in range(10):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert (obs_a, info_a["suffix"]) == (obs_b, info_b["suffix"])
        assert hidden_state(a.unwrapped) == hidden_state(b.unwrapped)
        states.add(hidden_state(a.unwrapped))
        for _ in range(5):
            action = a.unwrapped.oracle_action()
            result_a, result_b = a.step(action), b.step(action)
            assert result_a == result_b
            if result_a[2] or result_a[3]:
                break
    assert len(states) > 1


@pytest.mark.parametrize("env_id", LOGIC_IDS)
def test_clone_mid_game_replays_identically(env_id):
    env = gem_core.make(env_id)
    env.reset(seed=21)
    env.step(env.unwrapped.oracle_action())
    twin = env.clone()
    for _ in range(4):
        action = env.unwrapped.oracle_action()
        assert twin.unwrapped.oracle_action() == action
        result = env.step(action)
        assert twin.step(action) == result
        if result[2] or result[3]:
            break
