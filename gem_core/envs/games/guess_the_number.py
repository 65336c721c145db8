"""Guess The Number: find a hidden integer from higher/lower hints."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gem_core.envs.games.base import Move, TextGame, illegal, moved, won
from gem_core.envs.report import BlindCeiling, MetricColumn, ScriptedBaseline
from gem_core.params import Param, check_args, invalid
from gem_core.parsing import ECHO_CHARS, echo

if TYPE_CHECKING:
    from gem_core.rollout import Trajectory

_NUMBER = Param(int, low=-(10**9), high=10**9, none="a range drawn per episode")

# What a trainer reports of this game beyond success (gem_core.envs.report): hint use (:class:`HintUse`), by
# its metrics.jsonl names and table headers
HINT_COLUMNS = (
    MetricColumn("hint_consistent_rate", "consistent with hints"),  # guesses inside every earlier hint's bounds
    MetricColumn("hint_right_way_rate", "right way after a hint"),  # after "lower"/"higher", next guesses that moved that way
    MetricColumn("hint_right_after_lower_rate", "after lower"),  # the same after "lower" alone
    MetricColumn("hint_right_after_higher_rate", "after higher"),  # and after "higher" alone
)
HINT_BLIND_CEILING = "hint-blind ceiling (random, no repeats)"  # the scripted baseline of that name (:func:`baselines`)


class GuessTheNumber(TextGame):
    """Guess a number in ``[min_number, max_number]`` within ``max_turns`` guesses.

    Rewards: 1 for the right number; 0 for a hint; when the turns run out, a closeness reward
    ``1 - |guess - target| / (max - min)`` for the last valid guess (GEM's dense ending).
    ``min_number``/``max_number``/``max_turns`` all ``None`` draws a range per episode.
    """

    instructions_ask_first_move = True  # the instructions show the start and ask for the first move

    title = "Guess The Number"

    # the report hook (gem_core.envs.report): hint use per batch, scripted players, the hint-blind ceiling
    episode_metric_columns = HINT_COLUMNS
    episode_metrics_title = "hint use"
    blind_ceiling = BlindCeiling(
        baseline=HINT_BLIND_CEILING,
        label="hint-blind ceiling",
        meaning="the expected success of the best player that ignores the hints; above it, a policy reads them",
        at_or_below="what it learned, a player that ignores the hints gets as well",
    )

    params: ClassVar[dict[str, Param]] = {**TextGame.params, "min_number": _NUMBER, "max_number": _NUMBER}

    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        low, high = args["min_number"], args["max_number"]
        if low is not None and high is not None and not low < high:
            raise invalid("max_number", high, f"an integer > min_number ({low})")

    def __init__(self, min_number: int | None = 1, max_number: int | None = 20, max_turns: int | None = 20):
        check_args(type(self), {"min_number": min_number, "max_number": max_number, "max_turns": max_turns}, type(self).__name__)
        super().__init__(max_turns)
        self._random_range = min_number is None or max_number is None
        self._range_arg = (min_number, max_number)
        self.min_number = 1 if min_number is None else min_number
        self.max_number = 2 if max_number is None else max_number
        self.target = 0
        self.guessed: set[int] = set()
        self.last_guess: int | None = None

    def balanced_seeds(self, count: int, start: int) -> list[int]:
        """``count`` reset seeds from ``start`` whose targets are every number equally often
        (:func:`balanced_seeds`): what ``--balanced`` evaluations and held-out rows play."""
        return balanced_seeds(self, count, start)

    def start_state(self, seed: int) -> tuple[int, int, int, int]:
        """``(min, max, turns, target)`` of ``reset(seed)`` (the report hook): every step after the reset depends on
        these and the guesses alone. Resets this env."""
        self.reset(seed=seed)
        return (self.min_number, self.max_number, self.max_turns, self.target)

    def episode_metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
        """Hint use over ``trajectories`` (:func:`hint_use`, parsed from this game's feedback to each turn)."""
        use = hint_use([turn.observation for turn in t.turns] for t in trajectories)
        rates = (use.consistent_rate, use.right_way_rate, use.right_after_lower_rate, use.right_after_higher_rate)
        return {column.key: rate for column, rate in zip(HINT_COLUMNS, rates)}

    def scripted_baselines(self, seeds: Sequence[int]) -> list[ScriptedBaseline]:
        """Random valid guesses, the hint-blind ceiling and binary search on ``seeds`` (:func:`baselines`)."""
        return [
            ScriptedBaseline(b.name, b.success_rate, b.turns_when_solved, {column.key: getattr(b, column.key) for column in HINT_COLUMNS})
            for b in baselines(self, seeds)
        ]

    def new_game(self) -> None:
        if self._random_range:
            self.min_number = self._randint(1, 10)
            self.max_number = self._randint(self.min_number + 5, self.min_number + 50)
        else:
            self.min_number, self.max_number = self._range_arg
        if self._max_turns_arg is None:
            self.max_turns = math.ceil(math.sqrt(self.max_number - self.min_number)) + 1
        self.target = self._randint(self.min_number, self.max_number)
        self.guessed = set()
        self.last_guess = None

    def instructions(self) -> str:
        return (
            f"You are playing Guess The Number.\n"
            f"Guess the number between {self.min_number} and {self.max_number} (inclusive) within {self.max_turns} turns.\n"
            "After each guess you are told whether the target is higher or lower.\n"
            f"Only the number inside \\boxed{{}} counts as your guess, for example \\boxed{{{self.min_number}}}.\n"
            "Enter your first guess to start the game."
        )

    def task_suffix(self) -> str:
        return "Enter your next guess."

    def play(self, move: str) -> Move:
        try:
            guess = int(move)
        except ValueError:
            return illegal(f"At turn {self.turn}, {echo(move)} is not a whole number.")
        if guess < self.min_number or guess > self.max_number:
            shown = guess if len(move) <= ECHO_CHARS else echo(move)
            return illegal(f"At turn {self.turn}, you guessed {shown}, which is outside {self.min_number}-{self.max_number}.")
        guessed = self.guessed
        if guess in guessed:
            return illegal(f"At turn {self.turn}, you guessed {guess}, which you already guessed.")
        guessed.add(guess)
        self.last_guess = guess
        target = self.target
        if guess == target:
            return won(f"Congratulations! You guessed the correct number {target} in {self.turn} turns.", self.success_reward)
        hint = "lower" if guess > target else "higher"
        return moved(f"At turn {self.turn}, you guessed {guess}, and the target number is {hint} than {guess}.")

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        observation, reward = super().on_time_limit(observation, reward, invalid)
        if self.last_guess is not None and not invalid:
            reward = 1.0 - abs(self.last_guess - self.target) / (self.max_number - self.min_number)
        return observation, reward

    def random_move(self) -> str:
        return str(self._randint(self.min_number, self.max_number))

    def oracle_move(self) -> str:
        """Binary search over what the hints allow: wins within ceil(log2(range + 1)) turns.
        The bounds are worked out here from the guesses (not kept up to date in ``play``, the hot path)."""
        target = self.target
        low = max((g + 1 for g in self.guessed if g < target), default=self.min_number)
        high = min((g - 1 for g in self.guessed if g > target), default=self.max_number)
        return str((low + high) // 2)


# ------------------------------------------------------------------------------------------------
# Hint use: does a player read the feedback? Parsed from the env's own messages (those above).
# ------------------------------------------------------------------------------------------------

# Every message that names a whole number the player guessed: a hint, the win, a repeat, a guess out of range.
_HINT = re.compile(r"you guessed (-?\d+), and the target number is (lower|higher) than")
_WON = re.compile(r"You guessed the correct number (-?\d+)")
_NAMED = re.compile(r"you guessed (-?\d+), which (?:you already guessed|is outside)")


def parse_feedback(observation: str) -> tuple[int | None, str | None]:
    """``(guess, hint)`` from one of GuessTheNumber's feedback messages: the number the turn guessed
    (None when the turn named no whole number: a format error, a non-number) and ``"lower"``/``"higher"``
    (the target is lower/higher than the guess), ``"correct"``, or None (a repeat or out-of-range guess)."""
    found = _HINT.search(observation)
    if found:
        return int(found.group(1)), found.group(2)
    found = _WON.search(observation)
    if found:
        return int(found.group(1)), "correct"
    found = _NAMED.search(observation)
    if found:
        return int(found.group(1)), None
    return None, None


@dataclass
class HintUse:
    """How far guesses follow the earlier hints of their episode (sums: add episodes with ``+``).

    ``guesses_after_hint``: guesses made after at least one hint; ``consistent``: those of them inside
    every earlier hint's bounds (a repeat of a hinted number is outside them). ``moves_after_hint``:
    guesses made on the turn right after a "lower"/"higher"; ``right_way``: those below the previous guess
    after "lower", above it after "higher"; ``moves_after_lower``/``right_after_lower``: the same after "lower"
    alone (after "higher": the differences). Read the two directions apart: a policy that plays the same
    rising sequence whatever it is told (2, 3, 4, 5) is right after every "higher" and wrong after every
    "lower", and on 1-10 most of its hints are "higher", so its pooled rates beat a random player's."""

    guesses_after_hint: int = 0
    consistent: int = 0
    moves_after_hint: int = 0
    right_way: int = 0
    moves_after_lower: int = 0
    right_after_lower: int = 0

    def __add__(self, other: HintUse) -> HintUse:
        return HintUse(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @property
    def consistent_rate(self) -> float | None:
        return self.consistent / self.guesses_after_hint if self.guesses_after_hint else None

    @property
    def right_way_rate(self) -> float | None:
        return self.right_way / self.moves_after_hint if self.moves_after_hint else None

    @property
    def right_after_lower_rate(self) -> float | None:
        return self.right_after_lower / self.moves_after_lower if self.moves_after_lower else None

    @property
    def right_after_higher_rate(self) -> float | None:
        moves = self.moves_after_hint - self.moves_after_lower
        return (self.right_way - self.right_after_lower) / moves if moves else None


def episode_hint_use(observations: Sequence[str]) -> HintUse:
    """:class:`HintUse` of one episode from the env's feedback to each turn, in order."""
    low, high = -math.inf, math.inf  # the target is strictly between them, by the hints so far
    hinted = False
    previous: tuple[int, str] | None = None  # the last turn's (guess, hint) when it was a lower/higher hint
    use = HintUse()
    for observation in observations:
        guess, hint = parse_feedback(observation)
        if guess is not None:
            if hinted:
                use.guesses_after_hint += 1
                use.consistent += low < guess < high
            if previous is not None:
                use.moves_after_hint += 1
                last, direction = previous
                right = guess < last if direction == "lower" else guess > last
                use.right_way += right
                if direction == "lower":
                    use.moves_after_lower += 1
                    use.right_after_lower += right
        if hint in ("lower", "higher"):
            hinted = True
            if hint == "lower":
                high = min(high, guess)
            else:
                low = max(low, guess)
            previous = (guess, hint)
        else:
            previous = None
    return use


def hint_use(episodes: Iterable[Sequence[str]]) -> HintUse:
    """:class:`HintUse` summed over episodes, each given as the env's feedback to each of its turns."""
    total = HintUse()
    for observations in episodes:
        total = total + episode_hint_use(observations)
    return total


def balanced_seeds(env: GuessTheNumber, count: int, start: int) -> list[int]:
    """``count`` reset seeds from ``start`` up whose targets are every number of the range equally often
    (the first ``count % range`` numbers once more): the target is drawn from the seed
    (:meth:`GuessTheNumber.new_game`), so seeds are scanned in order and each kept while its target's quota
    lasts. A range drawn per episode has no fixed targets: consecutive seeds."""
    if env._random_range:
        return list(range(start, start + count))
    numbers = list(range(env.min_number, env.max_number + 1))
    quota = {n: count // len(numbers) + (i < count % len(numbers)) for i, n in enumerate(numbers)}
    seeds: list[int] = []
    seed = start
    while len(seeds) < count:
        env.reset(seed=seed)
        if quota[env.target] > 0:
            quota[env.target] -= 1
            seeds.append(seed)
        seed += 1
    return seeds


@dataclass
class Baseline:
    """A scripted player's numbers over a set of episodes (:func:`baselines`)."""

    name: str
    success_rate: float
    turns_when_solved: float | None
    hint_consistent_rate: float | None  # HintUse.consistent_rate (expected counts for the random players)
    hint_right_way_rate: float | None  # HintUse.right_way_rate
    hint_right_after_lower_rate: float | None  # HintUse.right_after_lower_rate
    hint_right_after_higher_rate: float | None  # HintUse.right_after_higher_rate


# Scripted players that enumerate their every move sequence exactly up to this many sequences per target;
# larger ranges are sampled (seeded).
EXACT_SEQUENCES = 20_000
SAMPLED_EPISODES = 2_000


def baselines(env: GuessTheNumber, seeds: Sequence[int]) -> list[Baseline]:
    """What three scripted players score on the episodes of ``seeds``, played on ``env`` itself:

    - random valid guesses: each turn a uniform number of the range (repeats allowed: the env refuses them);
    - the hint-blind ceiling: uniform numbers without repeats, the best a player that ignores the hints does;
    - binary search over what the hints allow (:meth:`GuessTheNumber.oracle_move`).

    ``seeds`` must not be empty. The random players are exact (every move sequence, equally weighted) where a target has at most
    :data:`EXACT_SEQUENCES` of them, else sampled (:data:`SAMPLED_EPISODES` per seed, seeded)."""
    # The feedback depends on the seed only through the game it draws: play one seed per distinct game.
    games: dict[tuple[int, int, int, int], list[int]] = {}
    for seed in seeds:
        env.reset(seed=seed)
        games.setdefault((env.min_number, env.max_number, env.max_turns, env.target), []).append(seed)
    players = {
        "random valid guesses": lambda numbers, turns: itertools.product(numbers, repeat=turns),
        HINT_BLIND_CEILING: lambda numbers, turns: itertools.permutations(numbers, turns),
    }
    out = []
    for name, sequences in players.items():
        wins = solved_turns = 0.0
        hints = _WeightedHintUse()
        for (low, high, turns, _), same in games.items():
            numbers = list(range(low, high + 1))
            if len(numbers) ** turns <= EXACT_SEQUENCES:
                plays = list(sequences(numbers, turns))
            else:
                rng = np.random.default_rng([same[0], len(name)])
                repeats = name.startswith("random valid")
                plays = [tuple(rng.choice(numbers, size=turns, replace=repeats or len(numbers) < turns).tolist()) for _ in range(SAMPLED_EPISODES)]
            weight = len(same) / len(plays)  # each sequence's probability, times the seeds that play this game
            for moves in plays:
                observations, won = _play(env, same[0], [str(m) for m in moves])
                wins += weight * won
                solved_turns += weight * won * len(observations)
                hints.add(episode_hint_use(observations), weight)
        out.append(Baseline(name, wins / len(seeds), solved_turns / wins if wins else None, *hints.rates()))
    won, solved_turns, use = 0, 0, HintUse()
    for same in games.values():
        observations, success = _play(env, same[0], None)
        won += success * len(same)
        solved_turns += success * len(same) * len(observations)
        for _ in same:
            use = use + episode_hint_use(observations)
    rates = (use.consistent_rate, use.right_way_rate, use.right_after_lower_rate, use.right_after_higher_rate)
    out.append(Baseline("binary search", won / len(seeds), solved_turns / won if won else None, *rates))
    return out


def _play(env: GuessTheNumber, seed: int, moves: Sequence[str] | None) -> tuple[list[str], bool]:
    """The env's feedback to each move of one episode and whether it was won; ``moves`` None: binary search."""
    env.reset(seed=seed)
    observations: list[str] = []
    success = False
    for turn in range(env.max_turns):
        action = env.oracle_action() if moves is None else "\\boxed{" + moves[turn] + "}"
        observation, _, terminated, truncated, info = env.step(action)
        observations.append(observation)
        success = bool(info["success"])
        if terminated or truncated:
            break
    return observations, success


class _WeightedHintUse:
    """Expected :class:`HintUse` counts of a random player (weights: each move sequence's probability)."""

    def __init__(self) -> None:
        self.sums = [0.0] * len(astuple(HintUse()))

    def add(self, use: HintUse, weight: float) -> None:
        self.sums = [s + weight * v for s, v in zip(self.sums, astuple(use))]

    def rates(self) -> tuple[float | None, ...]:
        """The :class:`HintUse` rates of the expected counts (as :class:`Baseline` lists them)."""
        after_hint, consistent, moves, right_way, after_lower, right_lower = self.sums
        after_higher, right_higher = moves - after_lower, right_way - right_lower

        def ratio(a: float, b: float) -> float | None:
            return a / b if b else None

        return ratio(consistent, after_hint), ratio(right_way, moves), ratio(right_lower, after_lower), ratio(right_higher, after_higher)
