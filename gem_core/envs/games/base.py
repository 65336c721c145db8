"""TextGame: the shared turn loop of every single-player game.

A game implements five small methods; this class does the rest the same way for all of them:
reading the action from the last ``\\boxed{...}``, the format-error penalty, the turn limit (as
truncation), the info keys, and refusing to step a finished episode.

Every step's info has ``turn``, ``success``, ``invalid_action``, ``format_error`` and ``suffix`` (what
to show after the observation), plus any keys the game adds (e.g. Wordle's ``feedback``). Reset's
info has the same keys and ``max_turns``, the episode's turn limit.

Rewards follow GEM: ``success_reward`` (1) when the game is won, dense per-turn progress where the
game has it, ``format_error_reward`` (-0.1) when no action can be read. Like GEM, a format error ends
the episode by default (``ends_on_format_error``), so an unparseable answer cannot be retried for free.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gem_core.core import Env
from gem_core.errors import ResetNeeded
from gem_core.params import MAX_TURNS_LIMIT, Param
from gem_core.parsing import BOX_MARKER, BOXED_AT, echo, last_boxed

#: The longest move (the text inside the box) a game reads. Every game's moves are a few words; a
#: longer one is refused before the game parses it, so a 10 MB answer costs one length check.
MAX_MOVE_CHARS = 1000


# What one valid (parseable) action did, as the tuple ``play`` returns:
# (observation, reward, terminated, success, invalid, info). ``invalid``: parsed, but illegal in this
# state (e.g. a guess out of range); ``info``: extra keys for the step's info dict, or None.
# A plain tuple, made by the four helpers below: a game makes one per step, and an instance of a class
# (or a NamedTuple) costs 0.2-0.4 us to make, a sixth of a whole step in the cheapest games.
Move = tuple[str, float, bool, bool, bool, "dict[str, Any] | None"]


def moved(observation: str, reward: float = 0.0, info: dict[str, Any] | None = None) -> Move:
    """A legal move; the game goes on."""
    return (observation, reward, False, False, False, info)


def illegal(observation: str, info: dict[str, Any] | None = None) -> Move:
    """A move read fine but not allowed in this state: it costs the turn and earns nothing."""
    return (observation, 0.0, False, False, True, info)


def won(observation: str, reward: float, info: dict[str, Any] | None = None) -> Move:
    """The move that wins: the episode ends in success."""
    return (observation, reward, True, True, False, info)


def lost(observation: str, reward: float = 0.0, info: dict[str, Any] | None = None) -> Move:
    """A move that ends the episode without winning (a mine, a board with no move left)."""
    return (observation, reward, True, False, False, info)


class TextGame(Env[str, str]):
    """Base class of the games. Subclasses implement ``new_game``, ``instructions``, ``play``,
    ``random_move`` and ``oracle_move``; they may override ``task_suffix`` and ``on_time_limit``.
    """

    title: ClassVar[str] = "a game"
    success_reward: ClassVar[float] = 1.0
    format_error_reward: ClassVar[float] = -0.1
    ends_on_format_error: ClassVar[bool] = True
    instructions_ask_first_move: ClassVar[bool] = False

    #: The constructor's arguments, their types and ranges (see gem_core.params); each game adds its own.
    params: ClassVar[dict[str, Param]] = {
        "max_turns": Param(int, low=1, high=MAX_TURNS_LIMIT, none="set per episode by the game"),
    }

    def __init__(self, max_turns: int | None = None):
        # Only this argument here: a game checks all of its arguments (and their rules) before this call.
        TextGame.params["max_turns"].check("max_turns", max_turns, type(self).__name__)
        self._max_turns_arg = max_turns
        self.max_turns: int = max_turns or 1
        self.turn = 0
        self._done = True

    # -- what a game implements ------------------------------------------------------------------
    def new_game(self) -> None:
        """Draw a new puzzle from ``self.np_random``; for random variants also draw its size and
        set ``self.max_turns`` (``self._max_turns_arg`` is ``None`` then)."""
        raise NotImplementedError

    def instructions(self) -> str:
        """The first observation: rules and the action format with an example (and the starting
        board, unless the game shows its board in ``task_suffix``)."""
        raise NotImplementedError

    def play(self, move: str) -> Move:
        """Apply the text inside the last ``\\boxed{}`` (stripped). Never raises on bad text.

        Returns a ``Move`` made by ``moved``, ``illegal``, ``won`` or ``lost`` (this module)."""
        raise NotImplementedError

    def random_move(self) -> str:
        """A random, well-formed move (the text inside the box) for the current state."""
        raise NotImplementedError

    def oracle_move(self) -> str:
        """A move that makes progress towards winning (may read hidden state). Used in tests."""
        raise NotImplementedError

    def task_suffix(self) -> str:
        """What to show after each observation: a request for the next move, and for games that do so
        (as GEM does) the current board. The history wrapper appends it; it may span several lines."""
        return "Enter your next move."

    def reset_suffix(self) -> str:
        """The suffix that follows the instructions after ``reset``: ``task_suffix()``, or nothing for a
        game whose instructions already show the starting position and ask for the first move
        (``instructions_ask_first_move``), so the model is not asked twice."""
        return "" if self.instructions_ask_first_move else self.task_suffix()

    def on_time_limit(self, observation: str, reward: float, invalid: bool) -> tuple[str, float]:
        """The last move's observation and reward when the turn limit ends the episode (a game may add
        e.g. GEM's closeness reward). ``invalid``: whether that last move was illegal."""
        return observation + " You have reached the maximum number of turns.", reward

    # -- the shared loop -------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._rand_buf = None  # the buffer belonged to the previous RNG
        self.turn = 0
        self._was_reset = True
        if self._max_turns_arg is not None:
            self.max_turns = self._max_turns_arg
        self.new_game()
        self._done = False
        # The keys of every step's info dict (built inline in step, the hot path), before any move, and
        # the episode's turn limit (fixed for the episode, so not repeated in every step's info).
        info = {"turn": 0, "max_turns": self.max_turns, "success": False, "invalid_action": False, "format_error": False, "suffix": self.reset_suffix()}
        return self.instructions(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        # The hot path of every game: kept flat.
        if self._done:
            if not self._was_reset:
                raise ResetNeeded(f"{type(self).__name__}.step() called before reset(); call reset() first to start an episode")
            raise ResetNeeded(f"{type(self).__name__}.step() called on a finished episode; call reset() first")
        turn = self.turn = self.turn + 1
        # last_boxed's common case inlined (no function frame: a third of the cheapest steps); it
        # settles the rest (nested braces, no brace, non-strings).
        found = BOXED_AT(action, action.rfind(BOX_MARKER)) if type(action) is str else None
        content = found[1] if found is not None else last_boxed(action)
        if content is None or not content.strip():  # an empty box holds no move: GEM's format error too
            what = "was not a string" if not isinstance(action, str) else "had no \\boxed{...} move" if content is None else "had an empty \\boxed{}"
            observation = f"At turn {turn}, your answer {what}. Put your move inside \\boxed{{}}, for example {self.sample_random_action()}."
            reward, terminated, success, invalid, extra = self.format_error_reward, self.ends_on_format_error, False, False, None
            format_error = True
        elif len(content) > MAX_MOVE_CHARS:
            observation = f"At turn {turn}, your move {echo(content)} is too long to be a move (at most {MAX_MOVE_CHARS} characters)."
            reward, terminated, success, invalid, extra = 0.0, False, False, True, None
            format_error = False
        else:
            observation, reward, terminated, success, invalid, extra = self.play(content.strip())
            format_error = False
        if terminated:
            truncated = False
        elif turn >= self.max_turns:
            observation, reward = self.on_time_limit(observation, reward, invalid)
            truncated = True
        else:
            truncated = False
        self._done = terminated or truncated
        # Built here, not in a helper shared with reset: a call less is 0.2 us, 9% of the cheapest steps.
        # Five keys: CPython makes a dict of up to five from a free list; a sixth cost 2% of a
        # GuessTheNumber step (counted in instructions), so the fixed max_turns is in reset's info only.
        info = {
            "turn": turn,
            "success": success,
            "invalid_action": invalid,
            "format_error": format_error,
            "suffix": self.task_suffix(),
        }
        if extra:
            info.update(extra)
        return observation, float(reward), terminated, truncated, info

    def sample_random_action(self) -> str:
        return "\\boxed{" + self.random_move() + "}"

    def oracle_action(self) -> str:
        """``oracle_move`` in the action format."""
        return "\\boxed{" + self.oracle_move() + "}"

    # Randomness helpers for subclasses -----------------------------------------------------------
    # Generator.integers costs ~4 us a call; games draw a few numbers per step, so we draw uniforms
    # from the env's own np_random in blocks. Deterministic for a seed, and part of get_state().
    _RAND_BLOCK: ClassVar[int] = 16
    # Class-level defaults, not self.__dict__.get(...): touching an instance's __dict__ makes CPython
    # 3.11 give up its fast attribute path for that instance, which slowed every later step.
    _rand_buf: list[float] | None = None
    _rand_pos: int = 0
    _was_reset: bool = False  # tells "step before any reset" from "step after the episode ended"

    def _uniform(self) -> float:
        """Next uniform float in [0, 1) from this env's RNG (buffered)."""
        buf = self._rand_buf
        i = self._rand_pos
        if buf is None or i >= len(buf):
            buf = self._rand_buf = self.np_random.random(self._RAND_BLOCK).tolist()
            i = 0
        self._rand_pos = i + 1
        return buf[i]

    def _randbelow(self, n: int) -> int:
        """Uniform integer in [0, n), from this env's RNG."""
        return int(self._uniform() * n)

    def _randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high] (inclusive), from this env's RNG."""
        return low + int(self._uniform() * (high - low + 1))

    def _choice(self, items):  # type: ignore[no-untyped-def]
        """A uniformly chosen element of a non-empty sequence."""
        return items[int(self._uniform() * len(items))]
