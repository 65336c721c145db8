"""English word lists for the word games, read from the ``english-words`` package (no download).

``english-words`` ships two lists: ``web2`` (Webster's Second International, ~235k entries) and
``gcide`` (the GNU Collaborative International Dictionary of English, ~115k headwords). We keep
plain lowercase ASCII words only and offer two tiers:

* ``"common"``: words in *both* dictionaries, written in lowercase in web2 (which capitalises proper
  nouns, so names drop out). Still a dictionary list, not a frequency list: some rare words remain.
* ``"all"``: every lowercase word of web2.

Lists are built once per process on first use, cached, and returned as sorted tuples, so a draw by
index from a seeded RNG gives the same word on every run and machine.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

WordTier = Literal["common", "all"]
TIERS: tuple[WordTier, ...] = ("common", "all")


def _plain(words: set[str]) -> set[str]:
    # Whole words of a-z only. (The package's ``alpha=True`` would instead delete the other
    # characters, turning "o'clock" into "oclock", so we filter here.)
    return {word for word in words if word.isascii() and word.isalpha() and word.islower()}


@cache
def word_set(tier: WordTier = "common") -> frozenset[str]:
    """Every word of a tier, as a set (for membership tests)."""
    from english_words import get_english_words_set  # imported here: loading the lists takes ~0.2 s

    if tier not in TIERS:
        raise ValueError(f"word tier must be one of {TIERS}, got {tier!r}")
    web2 = _plain(get_english_words_set(["web2"]))
    if tier == "all":
        return frozenset(web2)
    # gcide capitalises every headword, so it is compared in lowercase.
    gcide = _plain(get_english_words_set(["gcide"], lower=True))
    return frozenset(web2 & gcide)


@cache
def words_of_length(length: int, tier: WordTier = "common") -> tuple[str, ...]:
    """The words of a tier with exactly ``length`` letters, sorted."""
    if length < 1:
        raise ValueError(f"word length must be >= 1, got {length}")
    words = tuple(sorted(word for word in word_set(tier) if len(word) == length))
    if not words:
        raise ValueError(f"no {tier!r} words of length {length}")
    return words


@cache
def words_between(min_length: int, max_length: int, tier: WordTier = "common") -> tuple[str, ...]:
    """The words of a tier with ``min_length`` to ``max_length`` letters, sorted."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    return tuple(sorted(word for word in word_set(tier) if min_length <= len(word) <= max_length))


_EXAMPLES = ("a", "be", "cat", "tree", "house", "planet", "example", "elephant", "blueprint", "motorcycle")


def example_word(length: int) -> str:
    """A familiar word of ``length`` letters, for the action examples in game instructions."""
    if 1 <= length <= len(_EXAMPLES):
        return _EXAMPLES[length - 1]
    return words_of_length(length)[0]
