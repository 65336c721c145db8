"""Sokoban: push rules, win and rewards, the reverse-play generator (solvable within the turn
limit, proven by the forward solver) and the solver itself (optimal, checked by brute force)."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

import gem_core
from gem_core.envs.games.sokoban import DIRECTIONS, Sokoban, solution_budget, solve


def _game(variant: str = "easy") -> Sokoban:
    env = gem_core.make(f"game:Sokoban-v0-{variant}")
    assert isinstance(env.unwrapped, Sokoban)
    return env.unwrapped


def _play(game: Sokoban, move: str):
    return game.step(f"I will go \\boxed{{{move}}}")


def _brute_force_length(game: Sokoban) -> int | None:
    """Optimal solution length by plain breadth-first search over (player, boxes), one move per edge."""
    offsets = (-game.cols, game.cols, -1, 1)
    start = (game.player, game.boxes)
    seen = {start}
    frontier = deque([(start, 0)])
    while frontier:
        (player, boxes), depth = frontier.popleft()
        if boxes == game.targets:
            return depth
        for off in offsets:
            ahead = player + off
            if not game.open_cells[ahead]:
                continue
            if ahead in boxes:
                beyond = ahead + off
                if not game.open_cells[beyond] or beyond in boxes:
                    continue
                boxes2 = (boxes - {ahead}) | {beyond}
            else:
                boxes2 = boxes
            state = (ahead, boxes2)
            if state not in seen:
                seen.add(state)
                frontier.append((state, depth + 1))
    return None


CORRIDOR = """
# # # # # # #
# P X _ _ O #
# _ _ _ _ _ #
# # # # # # #
"""


# -- moves and pushes ---------------------------------------------------------------------------
def test_walking_and_pushing_move_player_and_box():
    game = _game()
    game.load_board(CORRIDOR)
    _, reward, terminated, _, info = _play(game, "down")
    assert (reward, terminated, info["invalid_action"]) == (0.0, False, False)
    assert game.player == 2 * game.cols + 1
    _play(game, "up")
    obs, reward, terminated, _truncated, info = _play(game, "right")
    assert "pushed a box" in obs
    assert game.player == game.cols + 2 and game.boxes == {game.cols + 3}
    assert game.render().splitlines()[1] == "# _ P X _ O #"


def test_moves_are_case_insensitive():
    game = _game()
    game.load_board(CORRIDOR)
    _play(game, "DOWN")
    assert game.player == 2 * game.cols + 1


def test_walking_into_a_wall_is_a_no_op_with_a_message():
    game = _game()
    game.load_board(CORRIDOR)
    board = game.render()
    obs, reward, terminated, truncated, info = _play(game, "up")
    assert "wall" in obs and info["invalid_action"] is True
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert game.render() == board


def test_cannot_push_a_box_into_a_wall():
    game = _game()
    game.load_board("""
        # # # # #
        # _ O _ #
        # _ P X #
        # # # # #
    """)
    board = game.render()
    obs, _reward, *_, info = _play(game, "right")
    assert "against a wall" in obs and info["invalid_action"] is True
    assert game.render() == board


def test_cannot_push_two_boxes_at_once():
    game = _game()
    game.load_board("""
        # # # # # # #
        # P X X _ _ #
        # _ _ O O _ #
        # # # # # # #
    """)
    board = game.render()
    obs, _reward, *_, info = _play(game, "right")
    assert "another box" in obs and info["invalid_action"] is True
    assert game.render() == board


def test_text_that_is_not_a_direction_is_invalid_but_not_fatal():
    game = _game()
    game.load_board(CORRIDOR)
    obs, reward, terminated, _truncated, info = _play(game, "jump")
    assert "not a move" in obs and "up, down, left or right" in obs
    assert (reward, terminated, info["invalid_action"], info["format_error"]) == (0.0, False, True, False)
    obs, reward, terminated, *_ = game.step("go right")
    assert reward == pytest.approx(-0.1) and terminated


# -- winning and rewards ------------------------------------------------------------------------
def test_pushing_the_last_box_home_wins():
    game = _game()
    game.load_board(CORRIDOR)
    for _ in range(2):
        obs, reward, terminated, truncated, info = _play(game, "right")
        assert reward == 0.0 and not terminated
    obs, reward, terminated, truncated, info = _play(game, "right")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert "Congratulations" in obs and info["boxes_on_targets"] == 1
    assert "√" in game.render()


def test_win_needs_every_box_on_a_target():
    game = _game()
    game.load_board("""
        # # # # # # #
        # P X O _ _ #
        # _ X O _ _ #
        # # # # # # #
    """)
    _, reward, terminated, *_, info = _play(game, "right")
    assert info["boxes_on_targets"] == 1 and not terminated and reward == 0.0
    for move in ("left", "down"):
        assert not _play(game, move)[2]
    _obs, reward, terminated, *_, info = _play(game, "right")
    assert terminated and reward == 1.0 and info["boxes_on_targets"] == 2


def test_time_limit_gives_the_share_of_boxes_on_targets():
    game = Sokoban(dim_room=(6, 6), num_boxes=2, max_turns=6)
    game.load_board("""
        # # # # # # #
        # P X O _ _ #
        # _ _ X _ O #
        # # # # # # #
    """)
    _play(game, "right")  # first box home
    for _ in range(4):
        assert not _play(game, "left")[3]
    obs, reward, terminated, truncated, _info = _play(game, "left")
    assert truncated and not terminated
    assert reward == pytest.approx(0.5)
    assert "maximum number of turns" in obs


def test_player_on_a_target_is_shown():
    game = _game()
    game.load_board("""
        # # # # # #
        # S X _ _ #
        # _ _ X O #
        # # # # # #
    """)
    assert game.render().splitlines()[1] == "# S X _ _ #"
    _play(game, "down")
    assert game.render().splitlines()[1:3] == ["# O X _ _ #", "# P _ X O #"]


def test_load_board_rejects_bad_boards():
    game = _game()
    with pytest.raises(ValueError, match="one player"):
        game.load_board("# # #\n# X #\n# O #\n# # #")
    with pytest.raises(ValueError, match="as many targets"):
        game.load_board("# # # #\n# P X #\n# _ _ #\n# # # #")
    with pytest.raises(ValueError, match="outer ring"):
        game.load_board("# # # #\n_ P X #\n# O _ #\n# # # #")


# -- the generator ------------------------------------------------------------------------------
@pytest.mark.parametrize(("variant", "seeds"), [("easy", 100), ("hard", 30), ("random", 40)])
def test_generated_puzzles_are_solvable_within_the_turn_limit(variant, seeds):
    game = _game(variant)
    for seed in range(seeds):
        game.reset(seed=seed)
        assert len(game.boxes) == len(game.targets) == game.num_boxes
        assert not game.boxes & game.targets, "a puzzle must not start with a box on a target"
        assert all(game.open_cells[c] for c in (*game.boxes, *game.targets, game.player))
        assert game.player not in game.boxes
        moves = solve(game.open_cells, game.cols, game.targets, game.player, game.boxes)
        assert moves is not None, f"{variant} seed {seed} is unsolvable"
        # The solver's optimum is no longer than the generator's reverse path, which fits the budget.
        assert 1 <= len(moves) <= game.generated_solution_length <= game.solution_budget < game.max_turns


def test_fixed_sizes_are_respected():
    for variant, (rows, cols, boxes, turns) in {"easy": (6, 6, 2, 20), "hard": (8, 8, 4, 50)}.items():
        game = _game(variant)
        game.reset(seed=1)
        assert (game.rows, game.cols, game.num_boxes, game.max_turns) == (rows, cols, boxes, turns)
        assert game.solution_budget == solution_budget(turns)


def test_random_variant_draws_sizes_per_episode():
    game = _game("random")
    seen = set()
    for seed in range(40):
        game.reset(seed=seed)
        assert 6 <= game.rows <= 8 and 6 <= game.cols <= 8
        assert 2 <= game.num_boxes <= min(game.rows, game.cols) - 4
        assert game.max_turns == 10 * game.num_boxes + 5 * (game.rows + game.cols - 12) // 2
        seen.add((game.rows, game.cols, game.num_boxes))
    assert len(seen) >= 5


def test_reset_is_deterministic_and_seeds_differ():
    a, b = _game("hard"), _game("hard")
    boards = set()
    for seed in range(20):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b
        boards.add(a.render())
    assert len(boards) == 20


def test_reset_leaves_global_rngs_alone():
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.random())
    random.seed(7)
    np.random.seed(7)
    game = _game("hard")
    for seed in range(5):
        game.reset(seed=seed)
        game.step(game.oracle_action())
    assert (random.random(), np.random.random()) == expected


def test_constructor_rejects_impossible_settings():
    with pytest.raises(ValueError, match=r"dim_room=\(4, 8\) is not allowed: expected a pair of integers in 5\.\.12"):
        Sokoban(dim_room=(4, 8), num_boxes=1, max_turns=20)
    with pytest.raises(ValueError, match="too small"):
        Sokoban(dim_room=(5, 5), num_boxes=4, max_turns=50)
    with pytest.raises(ValueError, match="too few"):
        Sokoban(dim_room=(8, 8), num_boxes=4, max_turns=8)
    with pytest.raises(ValueError, match="num_boxes"):
        Sokoban(dim_room=(6, 6), num_boxes=0, max_turns=20)


# -- the solver and the oracle ------------------------------------------------------------------
def test_solver_is_optimal_against_brute_force():
    game = _game("easy")
    for seed in range(25):
        game.reset(seed=seed)
        moves = solve(game.open_cells, game.cols, game.targets, game.player, game.boxes)
        assert len(moves) == _brute_force_length(game), f"seed {seed}"


def test_solver_reports_a_deadlock():
    game = _game()
    game.load_board("""
        # # # # # #
        # X _ _ O #
        # P _ _ _ #
        # # # # # #
    """)  # a box in a corner away from its target can never move again
    assert solve(game.open_cells, game.cols, game.targets, game.player, game.boxes) is None


@pytest.mark.parametrize("variant", ["easy", "hard", "random"])
def test_oracle_wins_in_the_optimal_number_of_moves(variant):
    game = _game(variant)
    for seed in range(5):
        game.reset(seed=seed)
        optimum = len(solve(game.open_cells, game.cols, game.targets, game.player, game.boxes))
        for turn in range(1, game.max_turns + 1):
            _obs, reward, terminated, truncated, info = game.step(game.oracle_action())
            if terminated or truncated:
                break
        assert info["success"] and reward == 1.0
        assert turn == optimum


def test_oracle_replans_after_the_player_strays():
    game = _game("hard")
    game.reset(seed=11)
    first = game.oracle_move()
    stray = next(d for d in DIRECTIONS if d != first)
    game.step(f"\\boxed{{{stray}}}")
    for _ in range(game.max_turns - 1):
        _obs, _reward, terminated, truncated, info = game.step(game.oracle_action())
        if terminated or truncated:
            break
    assert info["success"]


def test_oracle_reads_the_current_board_not_the_generator():
    game = _game("easy")
    game.reset(seed=0)
    game.load_board(CORRIDOR)  # a board the generator never made
    assert game.oracle_move() == "right"


def test_state_roundtrip_restores_board_and_rng():
    game = _game("hard")
    game.reset(seed=3)
    game.step(game.oracle_action())
    state = game.get_state()
    board, turn = game.render(), game.turn
    game.step(game.oracle_action())
    after_reset = game.reset()[0]
    game.set_state(state)
    assert (game.render(), game.turn) == (board, turn)
    assert game.reset()[0] == after_reset, "the RNG must be restored too"
