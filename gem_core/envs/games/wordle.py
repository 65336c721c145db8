"""Wordle: find a hidden word from per-letter feedback (G right place, Y elsewhere, X absent)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from typing import ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo, echo_bare
from gem_core.utils.words import example_word, words_of_length

GREEN, YELLOW, GREY = "G", "Y", "X"
MIN_LENGTH, MAX_LENGTH = 3, 5  # word lengths the random variant draws from


def score_guess(guess: str, secret: str) -> str:
    """The feedback string for ``guess`` against ``secret`` (same length, same case).

    Greens first; then each other guessed letter is yellow only while the secret still has an
    unmatched copy of it, left to right. So a letter guessed twice but present once gets one mark.
    """
    if guess == secret:
        return GREEN * len(guess)
    unmatched: dict[str, int] = {}
    for g, s in zip(guess, secret):
        if g != s:
            unmatched[s] = unmatched.get(s, 0) + 1
    marks = ""  # appending to a short str in place beats a list and a join here
    for g, s in zip(guess, secret):
        if g == s:
            marks += GREEN
        else:
            left = unmatched.get(g)
            if left:
                unmatched[g] = left - 1
                marks += YELLOW
            else:
                marks += GREY
    return marks


def consistent_words(words: Iterable[str], history: Iterable[tuple[str, str]]) -> list[str]:
    """The words that would have produced every (guess, feedback) pair in ``history``."""
    remaining = list(words)
    for guess, feedback in history:
        remaining = [word for word in remaining if score_guess(guess, word) == feedback]
    return remaining


def choose_guess(candidates: Sequence[str], pool: Sequence[str], already: Iterable[str] = ()) -> str:
    """A good next guess given the words still possible (``candidates``) and allowed probes (``pool``).

    Many candidates: the candidate whose distinct letters are most common among them (cheap).
    Few candidates: the word, candidate or probe, whose feedback splits them into the smallest
    expected group (sum of squared group sizes); probes matter when candidates differ in one slot
    (bat, cat, fat, hat, ...) and guessing them one by one would take too long.
    """
    if not candidates:
        raise ValueError("no word is consistent with the feedback")
    if len(candidates) <= 2:
        return candidates[0]
    tried = set(already)
    letter_counts: dict[str, int] = {}
    for word in candidates:
        for letter in set(word):
            letter_counts[letter] = letter_counts.get(letter, 0) + 1
    n = len(candidates)
    if n > 150:
        return max(candidates, key=lambda w: (sum(letter_counts[c] for c in set(w)), w))

    # Letters that split the candidates (present in some, absent in others) are informative.
    def split_score(word: str) -> int:
        return sum(min(letter_counts.get(c, 0), n - letter_counts.get(c, 0)) for c in set(word))

    candidate_set = set(candidates)
    probes = sorted((w for w in pool if w not in candidate_set and w not in tried), key=split_score, reverse=True)[:100]
    best, best_key = candidates[0], None
    for guess in list(candidates) + probes:
        groups: dict[str, int] = {}
        for secret in candidates:
            feedback = score_guess(guess, secret)
            groups[feedback] = groups.get(feedback, 0) + 1
        # Smaller expected group first; then prefer a guess that could win now.
        key = (sum(size * size for size in groups.values()), guess not in candidate_set)
        if best_key is None or key < best_key:
            best, best_key = guess, key
    return best


class Wordle(TextGame):
    """Guess a hidden ``word_length``-letter word within ``max_turns`` guesses.

    Each guess gets one mark per letter: G (right letter, right place), Y (in the word elsewhere),
    X (not in the word, or no more copies of it). Secrets come from the ``common`` tier of
    ``gem_core.utils.words``; any guess of the right number of letters a-z is accepted.
    Rewards (GEM's): the first time a position turns green it pays ``0.5 / word_length``; the
    winning guess pays the rest, so a won episode returns exactly 1.0 and a lost one at most 0.5.
    A guess of the wrong length, with non-letters, or repeated is invalid (reward 0, turn used).
    ``word_length=None``/``max_turns=None`` draws a length in 3-5 per episode, with 5 turns per letter.
    """

    title = "Wordle"
    progress_share = 0.5

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "word_length": Param(int, low=MIN_LENGTH, high=12, none=f"drawn per episode from {MIN_LENGTH}..{MAX_LENGTH}"),
    }

    def __init__(self, word_length: int | None = 5, max_turns: int | None = 20):
        check_args(type(self), {"word_length": word_length, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._word_length_arg = word_length
        self.word_length = word_length or MAX_LENGTH
        self.secret = ""
        self.history: list[tuple[str, str]] = []  # (guess, feedback), what the player has seen
        self.guessed: set[str] = set()  # the guesses in history, for the repeat check
        self.greens_seen: list[bool] = []
        self.progress_paid = 0.0

    def new_game(self) -> None:
        if self._word_length_arg is None:
            self.word_length = self._randint(MIN_LENGTH, MAX_LENGTH)
        else:
            self.word_length = self._word_length_arg
        if self._max_turns_arg is None:
            self.max_turns = 5 * self.word_length
        words = words_of_length(self.word_length)
        self.secret = words[int(self.np_random.integers(len(words)))]
        self.history = []
        self.guessed = set()
        self.greens_seen = [False] * self.word_length
        self.progress_paid = 0.0

    def instructions(self) -> str:
        example = example_word(self.word_length)
        return (
            "You are playing Wordle.\n"
            f"Find the secret {self.word_length}-letter English word within {self.max_turns} guesses.\n"
            "Each guess is marked letter by letter:\n"
            "  G - this letter is in the word at this position;\n"
            "  Y - this letter is in the word, but at another position;\n"
            "  X - this letter is not in the word (or the word has no more copies of it).\n"
            f"A guess must have exactly {self.word_length} letters and must not repeat an earlier guess.\n"
            f"Write your guess inside \\boxed{{}}, for example \\boxed{{{example}}}."
        )

    def task_suffix(self) -> str:
        return f"Enter your guess ({self.max_turns - self.turn} left)."

    def play(self, move: str) -> Move:
        guess = move.lower() if move.isalpha() else "".join(move.split()).lower()
        if not (guess.isascii() and guess.isalpha()):
            return illegal(f"At turn {self.turn}, {echo(move)} is not a word: use the letters a-z only.")
        shown = guess.upper()
        if len(guess) != self.word_length:
            return illegal(f"At turn {self.turn}, you guessed {echo_bare(shown)}, which has {len(guess)} letters; the secret word has {self.word_length}.")
        guessed = self.guessed
        if guess in guessed:
            return illegal(f"At turn {self.turn}, you guessed {shown} again; try a new word.")
        guessed.add(guess)
        secret = self.secret
        feedback = score_guess(guess, secret)
        self.history.append((guess, feedback))
        if guess == secret:
            reward = self.success_reward - self.progress_paid
            self.progress_paid = self.success_reward
            return won(f"Congratulations! {shown} is the secret word; you found it in {self.turn} turns.", reward, {"feedback": feedback})
        reward = 0.0
        if GREEN in feedback:
            greens_seen = self.greens_seen
            new_greens = 0
            for i, mark in enumerate(feedback):
                if mark == GREEN and not greens_seen[i]:
                    greens_seen[i] = True
                    new_greens += 1
            if new_greens:
                reward = self.progress_share * new_greens / self.word_length
                self.progress_paid += reward
        # Letters spaced out (one token each for most tokenizers); replace("", " ") is the cheap way.
        return moved(
            f"At turn {self.turn}, you guessed {shown}.\nFeedback:\n{shown.replace('', ' ')[1:-1]}\n{feedback.replace('', ' ')[1:-1]}",
            reward,
            {"feedback": feedback},
        )

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        return observation + f" The secret word was {self.secret.upper()}.", reward

    def random_move(self) -> str:
        words = words_of_length(self.word_length)
        return words[int(self.np_random.integers(len(words)))]

    def oracle_move(self) -> str:
        """A solver that sees only the feedback so far (never the secret): it keeps the words
        consistent with every mark and picks the guess that best splits them."""
        if not self.history:
            return _opening_guess(self.word_length)
        words = words_of_length(self.word_length)
        candidates = consistent_words(words, self.history)
        return choose_guess(candidates, words, [guess for guess, _ in self.history])


_OPENINGS: dict[int, str] = {}


def _opening_guess(length: int) -> str:
    """The solver's first guess for a length (the same every game, so computed once)."""
    if length not in _OPENINGS:
        words = words_of_length(length)
        _OPENINGS[length] = choose_guess(words, words)
    return _OPENINGS[length]
