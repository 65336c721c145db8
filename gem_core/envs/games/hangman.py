"""Hangman: reveal a hidden word by guessing its letters, or guess the whole word."""

from __future__ import annotations

import string

from typing import ClassVar

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.params import Param, check_args
from gem_core.parsing import echo, echo_bare
from gem_core.utils.words import example_word, words_of_length

# (word_length, max_turns) pairs the random variant draws from (GEM's).
RANDOM_SETTINGS = ((3, 10), (5, 15), (7, 20))


class Hangman(TextGame):
    """Find a hidden ``word_length``-letter word within ``max_turns`` guesses.

    A move is one letter (every copy of it is revealed) or the whole word. Revealing every letter
    or naming the word wins. Rewards (GEM's): a correct letter pays ``0.5 * revealed / word_length``;
    the winning move pays the rest, so a won episode returns exactly 1.0 and a lost one at most 0.5.
    A wrong letter or wrong word pays 0. A letter or word guessed before, a word of the wrong
    length, or text that is not letters is invalid (reward 0, turn used).
    Words come from the ``common`` tier of ``gem_core.utils.words``. ``word_length=None`` /
    ``max_turns=None`` draws (3, 10), (5, 15) or (7, 20) per episode.
    """

    title = "Hangman"
    progress_share = 0.5

    params: ClassVar[dict[str, Param]] = {
        **TextGame.params,
        "word_length": Param(int, low=2, high=15, none="drawn per episode with max_turns"),
    }

    def __init__(self, word_length: int | None = 5, max_turns: int | None = 20):
        check_args(type(self), {"word_length": word_length, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._word_length_arg = word_length
        self.word_length = word_length or 5
        self.secret = ""
        self.revealed: list[bool] = []
        self.guessed_letters: list[str] = []  # in the order guessed (shown to the player)
        self.guessed_words: list[str] = []
        self.progress_paid = 0.0

    def new_game(self) -> None:
        if self._word_length_arg is None:
            length, turns = RANDOM_SETTINGS[int(self.np_random.integers(len(RANDOM_SETTINGS)))]
        else:
            length, turns = self._word_length_arg, self.max_turns
        self.word_length = length
        if self._max_turns_arg is None:
            self.max_turns = turns
        words = words_of_length(self.word_length)
        self.secret = words[int(self.np_random.integers(len(words)))]
        self.revealed = [False] * self.word_length
        self.guessed_letters = []
        self.guessed_words = []
        self.progress_paid = 0.0

    def pattern(self) -> str:
        """The word as the player sees it: known letters, ``_`` for hidden ones."""
        return " ".join([c if shown else "_" for c, shown in zip(self.secret.upper(), self.revealed)])

    def state_text(self) -> str:
        return self.pattern()

    def instructions(self) -> str:
        return (
            "You are playing Hangman.\n"
            f"Find the secret {self.word_length}-letter English word within {self.max_turns} turns.\n"
            "Each turn, guess one letter, for example \\boxed{e}: every copy of it in the word is revealed.\n"
            f"Or guess the whole word, for example \\boxed{{{example_word(self.word_length)}}}. "
            "Revealing every letter or naming the word wins.\n"
            "Do not repeat a guess.\n"
            f"The word: {self.pattern()}"
        )

    def task_suffix(self) -> str:
        tried = ", ".join(self.guessed_letters).upper() or "none"
        return f"The word: {self.pattern()}\nLetters tried: {tried}\nEnter your guess."

    def play(self, move: str) -> Move:
        guess = move.lower()
        if not (guess.isascii() and guess.isalpha()):
            return illegal(f"At turn {self.turn}, {echo(move)} is not a letter or a word: use the letters a-z only.")
        if len(guess) == 1:
            return self._guess_letter(guess)
        return self._guess_word(guess)

    def _guess_letter(self, letter: str) -> Move:
        if letter in self.guessed_letters:
            return illegal(f"At turn {self.turn}, you guessed {letter.upper()} again; try another letter.")
        self.guessed_letters.append(letter)
        newly = []
        if letter in self.secret:  # most guesses miss: only a hit needs the positions
            newly = [i for i, c in enumerate(self.secret) if c == letter and not self.revealed[i]]
        if not newly:
            return moved(f"At turn {self.turn}, {letter.upper()} is not in the word.")
        for i in newly:
            self.revealed[i] = True
        if all(self.revealed):
            return self._win(f"Congratulations! You revealed the word {self.secret.upper()} in {self.turn} turns.")
        reward = self.progress_share * len(newly) / self.word_length
        self.progress_paid += reward
        times = "once" if len(newly) == 1 else f"{len(newly)} times"
        return moved(f"At turn {self.turn}, {letter.upper()} is in the word ({times}): {self.pattern()}", reward)

    def _guess_word(self, word: str) -> Move:
        if len(word) != self.word_length:
            return illegal(
                f"At turn {self.turn}, you guessed {echo_bare(word.upper())}, which has {len(word)} letters; the secret word has {self.word_length}.",
            )
        if word in self.guessed_words:
            return illegal(f"At turn {self.turn}, you guessed {word.upper()} again; try another word.")
        self.guessed_words.append(word)
        if word == self.secret:
            self.revealed = [True] * self.word_length
            return self._win(f"Congratulations! {word.upper()} is the secret word; you found it in {self.turn} turns.")
        return moved(f"At turn {self.turn}, {word.upper()} is not the secret word.")

    def _win(self, message: str) -> Move:
        reward = self.success_reward - self.progress_paid
        self.progress_paid = self.success_reward
        return won(message, reward)

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        return observation + f" The secret word was {self.secret.upper()}.", reward

    def random_move(self) -> str:
        untried = [c for c in string.ascii_lowercase if c not in self.guessed_letters]
        if not untried:  # every letter tried: only a word guess is left
            words = words_of_length(self.word_length)
            return words[int(self.np_random.integers(len(words)))]
        return untried[int(self.np_random.integers(len(untried)))]

    def oracle_move(self) -> str:
        """Reads the secret: the hidden letter with the most hidden copies (ties: alphabetical)."""
        hidden = [c for c, shown in zip(self.secret, self.revealed) if not shown]
        return max(sorted(set(hidden)), key=hidden.count)
