"""Rules, rewards and solvers of the word games: Wordle, Hangman, Crosswords, Word Search, and
the word lists they draw from."""

from __future__ import annotations

import socket
from collections import Counter
from importlib import resources

import pytest

import gem_core
from gem_core.envs.games.crosswords import BLOCK, HIDDEN, Crosswords, clue_bank, layout
from gem_core.envs.games.hangman import Hangman
from gem_core.envs.games.word_search import ALL_DIRECTIONS, BASIC_DIRECTIONS, WordSearch
from gem_core.envs.games.wordle import Wordle, choose_guess, consistent_words, score_guess
from gem_core.utils import words as words_module
from gem_core.utils.words import example_word, word_set, words_between, words_of_length


def boxed(move: str) -> str:
    return "\\boxed{" + move + "}"


# -- word lists -----------------------------------------------------------------------------------


def test_word_lists_are_sorted_plain_lowercase_and_from_english_words():
    from english_words import get_english_words_set

    web2 = get_english_words_set(["web2"])
    gcide = get_english_words_set(["gcide"], lower=True)
    for length in (3, 5, 7):
        words = words_of_length(length)
        assert list(words) == sorted(set(words))
        assert all(len(w) == length and w.isascii() and w.isalpha() and w.islower() for w in words)
        assert set(words) <= web2 and set(words) <= gcide  # "common" = in both dictionaries
    assert set(words_of_length(5)) < set(words_of_length(5, "all"))
    assert "Paris" in web2 and "paris" not in words_of_length(5)  # proper nouns are not folded in
    assert all(4 <= len(w) <= 7 for w in words_between(4, 7))


def test_word_lists_are_pinned_so_seeded_draws_match_across_machines():
    words = words_of_length(5)
    # Pinned for english-words 2.x: if the package's data changes, seeded puzzles change too.
    assert len(words) == 4732
    assert words[:3] == ("abaca", "aback", "abaft")
    env = gem_core.make("game:Wordle-v0-hard")
    env.reset(seed=0)
    first = env.unwrapped.secret
    env.reset(seed=0)
    assert env.unwrapped.secret == first and first in words


def test_word_lists_load_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network use is not allowed in this test")

    monkeypatch.setattr(socket, "socket", no_network)
    words_module.word_set.cache_clear()
    words_module.words_of_length.cache_clear()
    assert len(words_of_length(4)) > 1000
    assert word_set("common") == word_set("common")


def test_word_list_arguments_are_checked():
    with pytest.raises(ValueError):
        words_of_length(0)
    with pytest.raises(ValueError):
        word_set("rare")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        words_between(5, 3)
    assert all(len(example_word(n)) == n for n in range(1, 14))


# -- Wordle ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret, guess, expected",
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "tulip", "XXXXX"),
        ("abbey", "babes", "YYGGX"),  # swapped letters are yellow, the rest green
        ("crane", "geese", "XXXXG"),  # the only E is green, so the earlier E's get nothing
        ("steal", "eerie", "YXXXX"),  # one E in the secret: only the leftmost guessed E is yellow
        ("geese", "crane", "XXXXG"),  # several E's in the secret, one in the guess
        ("eerie", "steal", "XXYXX"),
        ("abbey", "kebab", "XYGYY"),  # the second B is yellow: one B is still unmatched
        ("abbey", "bobby", "YXGXG"),  # three B's guessed, two in the secret: one green, one yellow
        ("level", "lever", "GGGGX"),
    ],
)
def test_wordle_feedback_repeated_letters(secret, guess, expected):
    assert score_guess(guess, secret) == expected


def _reference_feedback(guess: str, secret: str) -> str:
    """Wordle marks the slow, obvious way: greens, then yellows while copies remain."""
    marks = ["X"] * len(guess)
    left = Counter(s for g, s in zip(guess, secret) if g != s)
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = "G"
    for i, g in enumerate(guess):
        if marks[i] != "G" and left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def test_wordle_feedback_matches_a_reference_on_many_pairs():
    words = words_of_length(4)
    pairs = [(words[i], words[(i * 7919) % len(words)]) for i in range(0, len(words), 3)]
    pairs += [("aabb", "bbaa"), ("abab", "bbbb"), ("aaaa", "abca")]
    for guess, secret in pairs:
        assert score_guess(guess, secret) == _reference_feedback(guess, secret), (guess, secret)


def _wordle(secret: str, max_turns: int = 10) -> Wordle:
    game = Wordle(word_length=len(secret), max_turns=max_turns)
    game.reset(seed=0)
    game.secret = secret
    return game


def test_wordle_rewards_new_greens_once_and_a_win_returns_one():
    game = _wordle("crane")
    _, r1, *_ = game.step(boxed("chips"))  # C green
    assert r1 == pytest.approx(0.5 * 1 / 5)
    _, r2, *_ = game.step(boxed("coral"))  # C green again: already paid; R, A only yellow
    assert r2 == 0.0
    _, r3, *_ = game.step(boxed("brine"))  # R, N, E newly green
    assert r3 == pytest.approx(0.5 * 3 / 5)
    obs, r4, terminated, truncated, info = game.step(boxed("CRANE"))
    assert terminated and not truncated and info["success"]
    assert r1 + r2 + r3 + r4 == pytest.approx(1.0)
    assert "Congratulations" in obs


def test_wordle_feedback_is_shown_and_in_info():
    game = _wordle("abbey")
    obs, *_, info = game.step(boxed("kebab"))
    assert info["feedback"] == "XYGYY"
    assert "X Y G Y Y" in obs and "K E B A B" in obs


@pytest.mark.parametrize("move, why", [("cran", "4 letters"), ("cranes", "6 letters"), ("cr4ne", "not a word")])
def test_wordle_invalid_guesses_use_a_turn_and_pay_nothing(move, why):
    """A bad guess is flagged, costs the turn and changes nothing (``why`` names the fault)."""
    game = _wordle("crane")
    _, reward, terminated, _, info = game.step(boxed(move))
    assert info["invalid_action"] and not info["format_error"]
    assert reward == 0.0 and not terminated and game.turn == 1
    assert game.history == []


def test_wordle_repeated_guess_is_invalid_and_time_limit_tells_the_word():
    game = _wordle("crane", max_turns=3)
    game.step(boxed("slate"))
    obs, reward, terminated, truncated, info = game.step(boxed("s l a t e"))  # spaces are ignored
    assert info["invalid_action"] and reward == 0.0
    obs, reward, terminated, truncated, info = game.step(boxed("fjord"))
    assert truncated and not terminated and not info["success"]
    assert "CRANE" in obs


def test_wordle_solver_uses_only_the_feedback():
    game = _wordle("crane")
    game.step(boxed("slate"))
    game.step(boxed("party"))
    candidates = consistent_words(words_of_length(5), game.history)
    assert "crane" in candidates and len(candidates) > 1
    move_with_real_secret = game.oracle_move()
    for other in candidates[:5]:
        game.secret = other  # any secret consistent with what the player saw
        assert game.oracle_move() == move_with_real_secret


@pytest.mark.parametrize("length, max_turns, step", [(3, 15, 12), (4, 20, 150), (5, 25, 300)])
def test_wordle_solver_wins_for_many_secrets(length, max_turns, step):
    """The solver sees only the feedback, so winning every time shows the feedback is right."""
    for secret in words_of_length(length)[::step]:
        game = _wordle(secret, max_turns=max_turns)
        for _ in range(max_turns):
            _, _, terminated, truncated, info = game.step(game.oracle_action())
            if terminated or truncated:
                break
        assert info["success"], f"solver failed on {secret!r}: {game.history}"


def test_choose_guess_uses_a_probe_when_candidates_differ_in_one_letter():
    candidates = ["bat", "cat", "fat", "hat", "mat", "pat", "rat", "sat"]
    guess = choose_guess(candidates, words_of_length(3))
    groups = Counter(score_guess(guess, secret) for secret in candidates)
    # Any of the candidates splits off only itself (2 groups); a probe with two of their first
    # letters splits them three ways.
    assert guess not in candidates and len(groups) >= 3


def test_wordle_random_variant_draws_the_length():
    env = gem_core.make("game:Wordle-v0-random")
    seen = set()
    for seed in range(30):
        env.reset(seed=seed)
        game = env.unwrapped
        assert 3 <= game.word_length <= 5 and game.max_turns == 5 * game.word_length
        assert len(game.secret) == game.word_length and len(game.random_move()) == game.word_length
        seen.add(game.word_length)
    assert seen == {3, 4, 5}


# -- Hangman --------------------------------------------------------------------------------------


def _hangman(secret: str, max_turns: int = 10) -> Hangman:
    game = Hangman(word_length=len(secret), max_turns=max_turns)
    game.reset(seed=0)
    game.secret = secret
    game.revealed = [False] * len(secret)
    return game


def test_hangman_letters_reveal_every_copy_and_pay_their_share():
    game = _hangman("apple")
    obs, reward, *_ = game.step(boxed("p"))
    assert reward == pytest.approx(0.5 * 2 / 5)
    assert game.pattern() == "_ P P _ _" and "2 times" in obs
    _, reward, *_ = game.step(boxed("z"))
    assert reward == 0.0
    _, reward, *_ = game.step(boxed("A"))  # upper case is the same letter
    assert reward == pytest.approx(0.5 * 1 / 5)
    _, reward, terminated, _, info = game.step(boxed("apple"))
    assert terminated and info["success"]
    assert reward == pytest.approx(1.0 - 0.3)


def test_hangman_revealing_the_last_letter_wins_with_total_one():
    game = _hangman("noon")
    total = 0.0
    for letter in "no":
        _, reward, terminated, _, info = game.step(boxed(letter))
        total += reward
    assert terminated and info["success"] and total == pytest.approx(1.0)


def test_hangman_repeated_guesses_are_invalid():
    game = _hangman("apple")
    game.step(boxed("p"))
    _, reward, terminated, _, info = game.step(boxed("p"))  # a right letter again
    assert info["invalid_action"] and reward == 0.0 and not terminated
    game.step(boxed("z"))
    _, reward, _, _, info = game.step(boxed("z"))  # a wrong letter again
    assert info["invalid_action"] and reward == 0.0
    game.step(boxed("ample"))
    _, reward, _, _, info = game.step(boxed("ample"))  # a wrong word again
    assert info["invalid_action"] and reward == 0.0
    assert game.guessed_letters == ["p", "z"] and game.guessed_words == ["ample"]


@pytest.mark.parametrize("move", ["ap", "apples", "a b", "7", "é"])
def test_hangman_malformed_guesses_are_invalid(move):
    game = _hangman("apple")
    _, reward, terminated, _, info = game.step(boxed(move))
    assert info["invalid_action"] and reward == 0.0 and not terminated
    assert not any(game.revealed)


def test_hangman_wrong_word_pays_nothing_and_time_limit_tells_the_word():
    game = _hangman("apple", max_turns=2)
    _, reward, terminated, _, info = game.step(boxed("angle"))
    assert reward == 0.0 and not terminated and not info["invalid_action"]
    obs, reward, terminated, truncated, info = game.step(boxed("q"))
    assert truncated and not terminated and "APPLE" in obs


def test_hangman_oracle_and_random_moves():
    game = _hangman("banana")
    assert game.oracle_move() == "a"  # the letter with the most hidden copies
    game.step(boxed("a"))
    assert game.oracle_move() == "n"
    for _ in range(5):
        move = game.random_move()
        assert len(move) == 1 and move not in game.guessed_letters


def test_hangman_random_variant_uses_gem_settings():
    env = gem_core.make("game:Hangman-v0-random")
    for seed in range(20):
        env.reset(seed=seed)
        game = env.unwrapped
        assert (game.word_length, game.max_turns) in {(3, 10), (5, 15), (7, 20)}
        assert len(game.secret) == game.word_length


# -- Crosswords -----------------------------------------------------------------------------------


def test_clue_bank_is_small_our_own_and_uses_listed_words():
    path = resources.files("gem_core").joinpath("data/crossword_clues.tsv")
    assert len(path.read_bytes()) < 200_000
    common = word_set("common")
    for level in ("basic", "hard"):
        bank = clue_bank(level)
        assert len(bank) >= 80
        # The file itself lists each answer once per level (clue_bank would drop a repeat silently).
        rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("#")]
        in_file = [answer for row_level, answer, _ in rows if row_level == level]
        assert len(set(in_file)) == len(in_file) == len(bank)
        answers = [answer for answer, _ in bank]
        assert all(answer in common for answer in answers)
        assert all(clue and answer not in clue.lower() for answer, clue in bank)  # a clue never gives its answer
    assert not {a for a, _ in clue_bank("basic")} & {a for a, _ in clue_bank("hard")}


def _runs(grid: list[str]) -> set[str]:
    """Every maximal line of two or more letters, across and down."""
    runs = set()
    for lines in (grid, ["".join(col) for col in zip(*grid)]):
        for line in lines:
            runs.update(piece for piece in line.split(BLOCK) if len(piece) >= 2)
    return runs


@pytest.mark.parametrize("hardcore", [False, True])
def test_crossword_grids_follow_crossword_rules(hardcore):
    env = Crosswords(num_words=4, hardcore=hardcore, max_turns=100)
    crossings = 0
    for seed in range(40):
        env.reset(seed=seed)
        answers = {clue.answer for clue in env.clues}
        assert len(env.clues) == 4
        bank = {a for a, _ in clue_bank("hard" if hardcore else "basic")}
        assert answers <= bank
        for clue in env.clues:
            assert "".join(env.solution[r][c] for r, c in clue.cells()) == clue.answer
        # No stray letter runs: every line of letters is exactly one answer.
        assert _runs(env.solution) == answers
        crossings += sum(len(clue.answer) for clue in env.clues) - env.letter_cells
        starts = [(clue.row, clue.col) for clue in env.clues]
        assert starts == sorted(starts) and [c.number for c in env.clues] == [1, 2, 3, 4]
    assert crossings > 20  # most puzzles really cross


def test_layout_is_deterministic_for_a_seed():
    import random

    answers = ["planet", "apple", "train", "leaf"]
    assert layout(answers, random.Random(3).randrange) == layout(answers, random.Random(3).randrange)


def test_crossword_letters_are_hidden_and_counted():
    env = Crosswords(num_words=4, hardcore=None, max_turns=100)
    for seed in range(30):
        env.reset(seed=seed)
        assert all(ch.islower() for clue in env.clues for ch in clue.answer)
        for board_row, solution_row in zip(env.board, env.solution):
            assert [BLOCK if ch == BLOCK else HIDDEN for ch in solution_row] == board_row
        assert env.letter_cells == sum(ch != BLOCK for row in env.solution for ch in row)


def _crossword() -> Crosswords:
    game = Crosswords(num_words=3, hardcore=False, max_turns=30)
    game.reset(seed=11)
    return game


def test_crossword_answers_are_checked():
    game = _crossword()
    clue = game.clues[0]
    wrong = "x" * len(clue.answer)
    _, reward, terminated, _, info = game.step(boxed(f"1 {wrong}"))
    assert reward == 0.0 and not info["invalid_action"] and not terminated
    assert all(game.board[r][c] == HIDDEN for r, c in clue.cells())
    _, reward, _, _, info = game.step(boxed(f"1 {wrong}"))
    assert info["invalid_action"], "the same wrong answer twice is flagged"
    _, reward, _, _, info = game.step(boxed(f"1 {clue.answer}x"))
    assert info["invalid_action"] and reward == 0.0, "wrong length"
    _, reward, _, _, info = game.step(boxed(f"9 {clue.answer}"))
    assert info["invalid_action"], "no clue 9"
    _, reward, _, _, info = game.step(boxed(f"1 {clue.answer.upper()}"))
    assert not info["invalid_action"]
    assert reward == pytest.approx(0.5 * len(clue.answer) / game.letter_cells)
    assert [game.board[r][c] for r, c in clue.cells()] == list(clue.answer)
    _, _, _, _, info = game.step(boxed(f"1 {clue.answer}"))
    assert info["invalid_action"], "a complete answer cannot be given again"


def test_crossword_cell_moves():
    game = _crossword()
    clue = game.clues[-1]
    (r, c), letter = clue.cells()[0], clue.answer[0]
    wrong = "z" if letter != "z" else "q"
    _, reward, _, _, info = game.step(boxed(f"{r} {c} {wrong}"))
    assert reward == 0.0 and not info["invalid_action"] and game.board[r][c] == HIDDEN
    _, _, _, _, info = game.step(boxed(f"[{r}, {c}, {wrong}]"))  # GEM's bracketed form reads the same
    assert info["invalid_action"], "the same wrong letter twice is flagged"
    _, reward, _, _, info = game.step(boxed(f"{r} {c} {letter.upper()}"))
    assert reward == pytest.approx(0.5 / game.letter_cells) and game.board[r][c] == letter
    _, _, _, _, info = game.step(boxed(f"{r} {c} {letter}"))
    assert info["invalid_action"], "cell already filled"
    block = next((i, j) for i, row in enumerate(game.solution) for j, ch in enumerate(row) if ch == BLOCK)
    _, _, _, _, info = game.step(boxed(f"{block[0]} {block[1]} a"))
    assert info["invalid_action"], "black square"
    for move in ("99 0 a", "-1 0 a", "0 0 ab", "0 a", "hello there friend", "1 2 3 4"):
        _, reward, terminated, _, info = game.step(boxed(move))
        assert info["invalid_action"] and reward == 0.0 and not terminated, move


def test_crossword_solved_by_letters_and_words_returns_one():
    game = _crossword()
    total = 0.0
    first = game.clues[0]
    for (r, c), letter in zip(first.cells()[:2], first.answer):
        total += game.step(boxed(f"{r} {c} {letter}"))[1]
    while True:
        _, reward, terminated, truncated, info = game.step(game.oracle_action())
        total += reward
        if terminated or truncated:
            break
    assert info["success"] and terminated
    assert total == pytest.approx(1.0)
    assert reward >= 0.5
    assert all(HIDDEN not in row for row in game.board)


def test_crossword_text_shows_clues_and_grid():
    game = _crossword()
    obs = game.instructions()
    for clue in game.clues:
        assert clue.clue in obs and f"from row {clue.row} col {clue.col}" in obs
    assert "Current grid" in game.task_suffix()


def test_crossword_random_variant():
    env = gem_core.make("game:Crosswords-v0-random")
    levels = set()
    for seed in range(20):
        env.reset(seed=seed)
        game = env.unwrapped
        assert 2 <= game.num_words <= 4 and len(game.clues) == game.num_words
        assert game.max_turns == game.letter_cells + game.num_words
        levels.add(game.hardcore)
    assert levels == {False, True}


# -- Word Search ----------------------------------------------------------------------------------


def _read(grid: list[str], r: int, c: int, dr: int, dc: int, n: int) -> str:
    return "".join(grid[r + i * dr][c + i * dc] for i in range(n))


@pytest.mark.parametrize("hardcore", [False, True])
def test_word_search_places_every_word_in_an_allowed_direction(hardcore):
    env = WordSearch(num_words=5, hardcore=hardcore, max_turns=20)
    used = set()
    for seed in range(40):
        env.reset(seed=seed)
        assert len(env.words) == 5 and len(set(env.words)) == 5
        assert all(len(row) == len(env.grid) for row in env.grid)
        for word, (r, c, dr, dc) in env.placements.items():
            assert _read(env.grid, r, c, dr, dc, len(word)) == word
            used.add((dr, dc))
    if hardcore:
        assert used == set(ALL_DIRECTIONS)  # diagonals and backwards all occur
    else:
        assert used == set(BASIC_DIRECTIONS)


def _word_search(hardcore: bool) -> WordSearch:
    """A hand-made 5x5 puzzle: CAT across, DOG down, OWL diagonal, RAT backwards, EEL up."""
    game = WordSearch(num_words=5, hardcore=hardcore, max_turns=30)
    game.reset(seed=0)
    game.grid = [
        "catxe",
        "doqye",
        "ozwxl",
        "gzqlm",
        "qtarq",
    ]
    game.words = ["cat", "dog", "eel", "owl", "rat"]
    game.num_words = 5
    game.placements = {
        "cat": (0, 0, 0, 1),
        "dog": (1, 0, 1, 0),
        "owl": (1, 1, 1, 1),
        "rat": (4, 3, 0, -1),
        "eel": (0, 4, 1, 0),
    }
    return game


def test_word_search_basic_rules():
    game = _word_search(hardcore=False)
    _, reward, _, _, info = game.step(boxed("0 0 0 2"))
    assert reward == pytest.approx(0.5 / 5) and game.found == ["cat"]
    _, reward, _, _, info = game.step(boxed("3 0 1 0"))  # end first: the same segment
    assert reward == pytest.approx(0.5 / 5) and game.found == ["cat", "dog"]
    _, reward, _, _, info = game.step(boxed("1 1 3 3"))
    assert info["invalid_action"] and "diagonal" in game.step(boxed("3 3 1 1"))[0]
    _, reward, _, _, info = game.step(boxed("0 2 0 0"))
    assert info["invalid_action"], "the same segment, reversed, was tried already"
    _, reward, _, _, info = game.step(boxed("2 0 2 3"))
    assert reward == 0.0 and not info["invalid_action"], "a straight miss costs a turn only"


def test_word_search_hardcore_diagonals_and_backwards():
    game = _word_search(hardcore=True)
    _, reward, _, _, info = game.step(boxed("1 1 3 3"))  # OWL, diagonal
    assert not info["invalid_action"] and game.found == ["owl"]
    _, reward, _, _, info = game.step(boxed("4 3 4 1"))  # RAT, right to left
    assert game.found == ["owl", "rat"]
    _, reward, _, _, info = game.step(boxed("0 4 2 4"))  # EEL, down
    assert game.found == ["owl", "rat", "eel"]
    game.step(boxed("0 0 0 2"))
    obs, reward, terminated, _, info = game.step(boxed("1 0 3 0"))
    assert terminated and info["success"] and "Congratulations" in obs
    assert reward == pytest.approx(1.0 - 4 * 0.5 / 5)


@pytest.mark.parametrize("move", ["0 0 1 2", "0 0 0 0", "0 0 0 5", "-1 0 0 0", "0 0 0", "a b c d", "0 0 0 2 1"])
def test_word_search_malformed_moves_are_invalid(move):
    game = _word_search(hardcore=True)
    _, reward, terminated, _, info = game.step(boxed(move))
    assert info["invalid_action"] and reward == 0.0 and not terminated and game.found == []


def test_word_search_found_word_again_elsewhere_is_invalid():
    game = _word_search(hardcore=True)
    game.grid[4] = "qcatz"  # a second CAT
    game.step(boxed("0 0 0 2"))
    _, reward, _, _, info = game.step(boxed("4 1 4 3"))
    assert info["invalid_action"] and reward == 0.0 and game.found == ["cat"]


def test_word_search_oracle_and_random_moves():
    env = gem_core.make("game:WordSearch-v0-hard")
    env.reset(seed=4)
    game = env.unwrapped
    size = len(game.grid)
    for _ in range(300):  # many draws, so corner cells (room on few diagonals) come up
        r1, c1, r2, c2 = map(int, game.random_move().split())
        assert all(0 <= n < size for n in (r1, c1, r2, c2)) and (r1, c1) != (r2, c2)
        dr, dc = r2 - r1, c2 - c1
        assert dr == 0 or dc == 0 or abs(dr) == abs(dc)
    total = 0.0
    for _ in range(game.num_words):
        total += env.step(game.oracle_action())[1]
    assert game.found == game.words and total == pytest.approx(1.0)


def test_word_search_random_move_from_every_start_cell():
    game = WordSearch(num_words=3, hardcore=True, max_turns=10)
    game.reset(seed=1)
    size, real_randint = len(game.grid), game._randint
    for r in range(size):
        for c in range(size):  # corners have room along few directions
            forced = iter([r, c])

            def start_here(low: int, high: int, forced=forced) -> int:
                value = next(forced, None)
                return real_randint(low, high) if value is None else value

            game._randint = start_here
            r1, c1, r2, c2 = map(int, game.random_move().split())
            assert (r1, c1) == (r, c) and 0 <= r2 < size and 0 <= c2 < size and (r2, c2) != (r, c)


def test_word_search_random_variant():
    env = gem_core.make("game:WordSearch-v0-random")
    modes = set()
    for seed in range(20):
        env.reset(seed=seed)
        game = env.unwrapped
        assert 3 <= game.num_words <= 6 and game.max_turns == 4 * game.num_words
        modes.add(game.hardcore)
    assert modes == {False, True}


# -- all four -------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["game:Wordle-v0-easy", "game:Hangman-v0-easy", "game:Crosswords-v0-easy", "game:WordSearch-v0-easy"])
def test_lost_episodes_return_at_most_the_progress_share(env_id):
    env = gem_core.make(env_id)
    losses = 0
    for seed in range(8):
        env.reset(seed=seed)
        total = 0.0
        while True:
            _, reward, terminated, truncated, info = env.step(env.sample_random_action())
            total += reward
            if terminated or truncated:
                break
        if info["success"]:
            assert total == pytest.approx(1.0)
        else:
            losses += 1
            assert truncated and 0.0 <= total <= 0.5 + 1e-9
    assert losses > 0
