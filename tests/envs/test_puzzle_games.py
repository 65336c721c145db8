"""Tower of Hanoi, Fifteen Puzzle and 2048: rules, rewards, generators and oracles."""

from __future__ import annotations

import itertools
from collections import deque

import pytest

import gem_core
from gem_core.envs.games.fifteen_puzzle import (
    SCRAMBLE_CAP,
    FifteenPuzzle,
    apply_direction,
    gap_moves,
    is_solvable,
    solve,
    solved_board,
)
from gem_core.envs.games.game_2048 import Game2048, can_move, slide_board, slide_line
from gem_core.envs.games.tower_of_hanoi import TowerOfHanoi


def boxed(move: str) -> str:
    return "\\boxed{" + move + "}"


def play_oracle(env) -> tuple[list[float], dict, int]:
    """Play the oracle to the end; the rewards, the last info and the number of turns used."""
    game = env.unwrapped
    rewards = []
    while True:
        _, reward, terminated, truncated, info = env.step(game.oracle_action())
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info, len(rewards)


# ---------------------------------------------------------------------------------------------
# Tower of Hanoi
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id, disks, turns", [("game:TowerofHanoi-v0-easy", 3, 10), ("game:TowerofHanoi-v0-hard", 5, 35)])
def test_hanoi_oracle_is_optimal_from_the_start(env_id, disks, turns):
    env = gem_core.make(env_id)
    env.reset(seed=0)
    assert (env.unwrapped.num_disks, env.unwrapped.max_turns) == (disks, turns)
    rewards, info, used = play_oracle(env)
    assert info["success"] and used == 2**disks - 1
    assert rewards == [0.0] * (used - 1) + [1.0]


@pytest.mark.parametrize("seed", range(5))
def test_hanoi_oracle_finishes_from_any_position_within_the_optimal_bound(seed):
    game = TowerOfHanoi(num_disks=4, max_turns=200)
    game.reset(seed=seed)
    for _ in range(3 + 5 * seed):  # wander off the optimal path first
        game.step(game.sample_random_action())
    if game._done:
        pytest.skip("the random walk happened to solve it")
    start = game.turn
    while True:
        _, reward, terminated, truncated, info = game.step(game.oracle_action())
        assert not info["invalid_action"]
        if terminated or truncated:
            break
    assert info["success"] and reward == 1.0
    assert game.turn - start <= 2**4 - 1  # no position of n disks is farther than 2**n - 1 moves


@pytest.mark.parametrize("text", ["A C", "a c", "A,C", "AC", "A -> C", "A to C", "from a to c"])
def test_hanoi_accepts_common_move_spellings(text):
    game = TowerOfHanoi(num_disks=3, max_turns=10)
    game.reset(seed=0)
    obs, reward, terminated, _, info = game.step(boxed(text))
    assert not info["invalid_action"] and game.pegs == [[3, 2], [], [1]]
    assert "C: [1]" in obs and reward == 0.0 and not terminated


@pytest.mark.parametrize(
    "text, why",
    [("B C", "empty"), ("A A", "onto itself"), ("A D", "not a move"), ("up", "not a move")],
)
def test_hanoi_illegal_moves_change_nothing(text, why):
    game = TowerOfHanoi(num_disks=3, max_turns=10)
    game.reset(seed=0)
    obs, reward, terminated, truncated, info = game.step(boxed(text))
    assert info["invalid_action"] and why in obs
    assert reward == 0.0 and not terminated and not truncated
    assert game.pegs == [[3, 2, 1], [], []]


def test_hanoi_refuses_a_larger_disk_on_a_smaller_one():
    game = TowerOfHanoi(num_disks=3, max_turns=10)
    game.reset(seed=0)
    game.step(boxed("A C"))  # disk 1 to C
    obs, _, _, _, info = game.step(boxed("A C"))  # disk 2 onto disk 1
    assert info["invalid_action"] and "smaller" in obs
    assert game.pegs == [[3, 2], [], [1]]


def test_hanoi_time_limit_pays_the_fraction_of_disks_on_c():
    game = TowerOfHanoi(num_disks=3, max_turns=3)
    game.reset(seed=0)
    game.step(boxed("A C"))
    game.step(boxed("A B"))
    _, reward, terminated, truncated, _ = game.step(boxed("C B"))  # C is empty again
    assert truncated and not terminated and reward == 0.0
    game.reset(seed=0)
    game.step(boxed("A C"))
    game.step(boxed("A B"))
    _, reward, _, truncated, _ = game.step(boxed("B B"))  # an invalid last move is still scored
    assert truncated and reward == pytest.approx(1 / 3)


def test_hanoi_random_variant_always_leaves_room_for_the_optimal_solution():
    env = gem_core.make("game:TowerofHanoi-v0-random")
    seen = set()
    for seed in range(60):
        env.reset(seed=seed)
        game = env.unwrapped
        seen.add(game.num_disks)
        assert game.max_turns >= 2**game.num_disks - 1
        assert game.pegs == [list(range(game.num_disks, 0, -1)), [], []]
    assert seen == {3, 4, 5}


def test_hanoi_rejects_bad_settings():
    with pytest.raises(ValueError, match="num_disks"):
        TowerOfHanoi(num_disks=0)


# ---------------------------------------------------------------------------------------------
# Fifteen Puzzle
# ---------------------------------------------------------------------------------------------


def bfs_distances(num_rows: int, limit: int) -> dict[tuple[int, ...], int]:
    """Exact shortest-solution lengths of every board within ``limit`` moves of solved."""
    start = solved_board(num_rows)
    dist = {start: 0}
    queue = deque([start])
    while queue:
        board = queue.popleft()
        if dist[board] == limit:
            continue
        gap = board.index(0)
        for _, new_gap in gap_moves(num_rows)[gap]:
            nxt = list(board)
            nxt[gap], nxt[new_gap] = nxt[new_gap], 0
            key = tuple(nxt)
            if key not in dist:
                dist[key] = dist[board] + 1
                queue.append(key)
    return dist


def replay(board: tuple[int, ...], num_rows: int, moves: list[str]) -> tuple[int, ...]:
    state = list(board)
    for move in moves:
        assert apply_direction(state, num_rows, move), f"illegal move {move} in the solution"
    return tuple(state)


def test_parity_test_matches_reachability_on_2x2():
    reachable = set(bfs_distances(2, limit=100))
    boards = [tuple(p) for p in itertools.permutations(range(4))]
    assert len(reachable) == 12
    assert {b for b in boards if is_solvable(b, 2)} == reachable


def test_solver_is_optimal_against_breadth_first_search():
    for num_rows, limit in ((2, 100), (3, 12)):
        dist = bfs_distances(num_rows, limit)
        boards = sorted(dist)[:: max(1, len(dist) // 300)]  # a spread of boards at every depth
        for board in boards:
            plan = solve(board, num_rows)
            assert plan is not None and len(plan) == dist[board], board
            assert replay(board, num_rows, plan) == solved_board(num_rows)


def test_solver_rejects_unsolvable_boards():
    swapped = (2, 1, 3, 4, 5, 6, 7, 8, 0)  # one swap of two tiles: the classic unsolvable board
    assert not is_solvable(swapped, 3)
    assert solve(swapped, 3) is None


@pytest.mark.parametrize(
    "env_id, seeds",
    [("game:FifteenPuzzle-v0-easy", range(30)), ("game:FifteenPuzzle-v0-hard", range(4)), ("game:FifteenPuzzle-v0-random", range(12))],
)
def test_generated_boards_are_solvable_within_the_turn_limit(env_id, seeds):
    """The proof is a solution found from the board itself, not the scramble that made it."""
    env = gem_core.make(env_id)
    for seed in seeds:
        env.reset(seed=seed)
        game = env.unwrapped
        board, n = tuple(game.board), game.num_rows
        assert board != solved_board(n)
        assert is_solvable(board, n)
        plan = solve(board, n)
        assert plan is not None and 1 <= len(plan) <= game.max_turns
        assert replay(board, n, plan) == solved_board(n)
        longest = min(game.max_turns, SCRAMBLE_CAP)
        assert (longest + 1) // 2 <= game.scramble_length <= longest


def test_random_variant_draws_every_size_with_gem_turn_limits():
    env = gem_core.make("game:FifteenPuzzle-v0-random")
    seen = {}
    for seed in range(40):
        env.reset(seed=seed)
        seen[env.unwrapped.num_rows] = env.unwrapped.max_turns
    assert seen == {2: 10, 3: 20, 4: 50}


def test_directions_name_the_way_the_tile_moves():
    game = FifteenPuzzle(num_rows=3, max_turns=20)
    game.reset(seed=0)
    game.board = [1, 2, 3, 4, 0, 5, 6, 7, 8]
    game.step(boxed("up"))  # the tile below the gap (7) moves up
    assert game.board == [1, 2, 3, 4, 7, 5, 6, 0, 8]
    game.step(boxed("Left"))  # the tile right of the gap (8) moves left; case does not matter
    assert game.board == [1, 2, 3, 4, 7, 5, 6, 8, 0]
    game.step(boxed("down"))  # the tile above the gap (5) moves down
    assert game.board == [1, 2, 3, 4, 7, 0, 6, 8, 5]
    game.step(boxed("right"))  # the tile left of the gap (7) moves right
    assert game.board == [1, 2, 3, 4, 0, 7, 6, 8, 5]


def test_fifteen_invalid_moves_change_nothing():
    game = FifteenPuzzle(num_rows=3, max_turns=20)
    game.reset(seed=0)
    game.board = [1, 2, 3, 4, 5, 6, 7, 8, 0][::-1]  # gap in the top-left corner
    before = list(game.board)
    for text, why in (("down", "no tile above"), ("right", "no tile to the left"), ("north", "not a direction")):
        obs, reward, terminated, _, info = game.step(boxed(text))
        assert info["invalid_action"] and why in obs and reward == 0.0 and not terminated
    assert game.board == before


def test_fifteen_win_and_time_limit_rewards():
    game = FifteenPuzzle(num_rows=2, max_turns=10)
    game.reset(seed=0)
    game.board = [1, 2, 0, 3]
    _, reward, terminated, _, info = game.step(boxed("left"))
    assert terminated and info["success"] and reward == 1.0
    game = FifteenPuzzle(num_rows=3, max_turns=1)
    game.reset(seed=0)
    game.board = [1, 2, 3, 4, 5, 6, 0, 7, 8]
    _, reward, _, truncated, info = game.step(boxed("left"))  # 7 slides home; 8 and the gap do not
    assert truncated and not info["success"]
    assert reward == pytest.approx(7 / 9)  # GEM's soft reward: cells holding their final tile, gap included


def test_fifteen_oracle_replans_after_a_detour():
    env = gem_core.make("game:FifteenPuzzle-v0-random")
    env.reset(seed=4)
    game = env.unwrapped
    game.oracle_move()  # caches a plan
    game.step(game.sample_random_action())  # then the board leaves that plan
    game.step(game.sample_random_action())
    remaining = game.max_turns - game.turn
    if game._done or len(solve(tuple(game.board), game.num_rows)) > remaining:
        pytest.skip("the detour used up the slack")
    rewards, info, _ = play_oracle(env)
    assert info["success"] and rewards[-1] == 1.0


def test_fifteen_rejects_bad_settings():
    with pytest.raises(ValueError, match="num_rows"):
        FifteenPuzzle(num_rows=1)


# ---------------------------------------------------------------------------------------------
# 2048
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, expected",
    [
        ((2, 2, 2, 2), (4, 4, 0, 0)),
        ((4, 4, 8, 0), (8, 8, 0, 0)),  # the new 8 does not merge again in the same move
        ((2, 2, 4, 0), (4, 4, 0, 0)),
        ((0, 2, 0, 2), (4, 0, 0, 0)),
        ((2, 2, 2, 0), (4, 2, 0, 0)),  # the pair nearest the wall merges first
        ((4, 0, 4, 4), (8, 4, 0, 0)),
        ((8, 8, 16, 16), (16, 32, 0, 0)),
        ((0, 0, 0, 2), (2, 0, 0, 0)),
        ((2, 4, 2, 4), (2, 4, 2, 4)),
        ((0, 0, 0, 0), (0, 0, 0, 0)),
    ],
)
def test_slide_line_merge_rules(line, expected):
    assert slide_line(line) == expected


def test_slide_board_in_each_direction():
    board = [
        2, 2, 2, 2,
        0, 0, 0, 4,
        0, 0, 0, 4,
        2, 0, 0, 8,
    ]  # fmt: skip
    assert slide_board(board, 4, "left")[:4] == [4, 4, 0, 0]
    assert slide_board(board, 4, "right")[:4] == [0, 0, 4, 4]
    assert slide_board(board, 4, "up")[3::4] == [2, 8, 8, 0]
    assert slide_board(board, 4, "down")[3::4] == [0, 2, 8, 8]
    assert slide_board(board, 4, "down")[0::4] == [0, 0, 0, 4]
    assert slide_board([2, 4, 8, 16], 2, "left") is None  # nothing moves: no new board


def test_no_op_move_is_invalid_and_spawns_nothing():
    game = Game2048(target_tile=64, max_turns=50)
    game.reset(seed=0)
    game.board = [2, 0, 0, 0] + [0] * 12  # already as far up and left as it goes
    rng_before = game.np_random.bit_generator.state
    obs, reward, terminated, _, info = game.step(boxed("left"))
    assert info["invalid_action"] and "changes nothing" in obs
    assert reward == 0.0 and not terminated
    assert game.board == [2, 0, 0, 0] + [0] * 12
    assert game.np_random.bit_generator.state == rng_before


def test_a_move_spawns_exactly_one_new_tile():
    game = Game2048(target_tile=64, max_turns=50)
    for seed in range(20):
        game.reset(seed=seed)
        assert sum(1 for v in game.board if v) == 2
        for direction in ("left", "up", "right", "down"):
            slid = slide_board(game.board, 4, direction)
            if slid is not None:
                break
        game.step(boxed(direction))
        new_cells = [i for i in range(16) if game.board[i] != slid[i]]
        assert len(new_cells) == 1 and slid[new_cells[0]] == 0 and game.board[new_cells[0]] in (2, 4)


def test_game_over_when_no_move_is_left():
    game = Game2048(target_tile=2048, max_turns=100)
    game.reset(seed=0)
    game.board = [
        2, 2, 8, 16,  # only this merge is left; afterwards a new tile fills the one empty cell
        32, 64, 128, 256,
        8, 16, 32, 64,
        32, 64, 128, 256,
    ]  # fmt: skip
    assert can_move(game.board, 4)
    obs, _, terminated, truncated, info = game.step(boxed("left"))
    assert terminated and not truncated and not info["success"]
    assert "Game over" in obs and not can_move(game.board, 4)


def test_can_move():
    full = [2, 4, 2, 4, 4, 2, 4, 2, 2, 4, 2, 4, 4, 2, 4, 2]
    assert not can_move(full, 4)
    assert can_move(full[:-1] + [0], 4)
    assert can_move([2, 2, 4, 8], 2) and can_move([2, 4, 2, 8], 2) and not can_move([2, 4, 8, 2], 2)


def test_progress_rewards_add_up_to_one_on_a_win():
    env = gem_core.make("game:Game2048-v0-easy")
    env.reset(seed=1)
    rewards, info, _ = play_oracle(env)
    assert info["success"] and info["max_tile"] >= 64
    assert all(r >= 0 for r in rewards) and rewards[-1] > 0
    assert sum(rewards) == pytest.approx(1.0)


def test_progress_reward_is_log_scaled():
    game = Game2048(target_tile=64, max_turns=50)
    game.reset(seed=0)
    game.board = [8, 8] + [0] * 14
    game.start_max = game.max_tile = 2
    _, reward, _, _, _ = game.step(boxed("left"))  # 2 -> 16 is three of the five doublings to 64
    assert reward == pytest.approx(3 / 5)


def test_oracle_reaches_64_on_easy_on_most_seeds():
    env = gem_core.make("game:Game2048-v0-easy")
    wins = 0
    for seed in range(10):
        env.reset(seed=seed)
        _, info, used = play_oracle(env)
        assert used <= 50
        wins += info["success"]
    assert wins >= 8


def test_oracle_and_random_actions_leave_the_tile_spawns_alone():
    game = Game2048(target_tile=64, max_turns=50)
    game.reset(seed=3)
    rng_before = game.np_random.bit_generator.state
    game.oracle_move()
    game.random_move()
    assert game.np_random.bit_generator.state == rng_before


def test_2048_random_variant_and_bad_settings():
    env = gem_core.make("game:Game2048-v0-random")
    seen = {}
    for seed in range(30):
        env.reset(seed=seed)
        seen[env.unwrapped.target_tile] = env.unwrapped.max_turns
    assert seen == {16: 20, 32: 30, 64: 50}
    for bad in (100, 4):
        with pytest.raises(ValueError, match="target_tile"):
            Game2048(target_tile=bad)


def test_2048_starts_with_two_tiles_on_distinct_cells():
    game = Game2048(target_tile=64, max_turns=50, board_size=3)
    for seed in range(50):
        game.reset(seed=seed)
        tiles = [v for v in game.board if v]
        assert len(tiles) == 2 and set(tiles) <= {2, 4}
        assert game.start_max == max(tiles)
