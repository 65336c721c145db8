"""ReasoningGym envs: every dataset of the ``reasoning-gym`` package as ``rg:<name>``, graded by its own scorer.

Single turn: the observation is the dataset item's question and the request to box the answer; the
step scores the last ``\\boxed{}`` with the dataset's ``score_answer`` (its own rules: 1 for right,
partial credit where the dataset gives it) and ends the episode. ``size``/``seed``/``config`` go to
``reasoning_gym.create_dataset(name, size=, seed=, **config)``. Episodes walk positions as the dataset
envs do: ``reset(seed=s)`` is position ``s``, ``reset()`` the next one; position ``p`` is item ``p % size`` of
the dataset made with seed ``seed + p // size`` (a new set of items every epoch);
``reset(options={"idx": i})`` is item ``i`` of the first. Answers longer than
:data:`MAX_ANSWER_CHARS` score 0 without reaching the scorer (some scorers parse with sympy).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from gem_core.core import Env
from gem_core.errors import GemError, InvalidArgumentError, ResetNeeded
from gem_core.params import Param, invalid
from gem_core.parsing import echo, last_boxed

#: The datasets of reasoning-gym 0.1.25 (``composite``, which only mixes others, is left out); the ids are
#: registered from this list so that ``import gem_core`` does not import reasoning-gym.
RG_DATASETS = (
    "ab",
    "acre",
    "advanced_geometry",
    "aiw",
    "arc_1d",
    "arc_agi",
    "base_conversion",
    "basic_arithmetic",
    "bf",
    "binary_alternation",
    "binary_matrix",
    "bitwise_arithmetic",
    "boxnet",
    "caesar_cipher",
    "calendar_arithmetic",
    "chain_sum",
    "circuit_logic",
    "codeio",
    "coin_flip",
    "color_cube_rotation",
    "complex_arithmetic",
    "count_bits",
    "count_primes",
    "countdown",
    "course_schedule",
    "cryptarithm",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "emoji_mystery",
    "family_relationships",
    "figlet_font",
    "fraction_simplification",
    "futoshiki",
    "game_of_life",
    "game_of_life_halting",
    "gcd",
    "graph_color",
    "group_anagrams",
    "gsm_symbolic",
    "intermediate_integration",
    "isomorphic_strings",
    "jugs",
    "kakurasu",
    "knight_swap",
    "knights_knaves",
    "largest_island",
    "lcm",
    "leg_counting",
    "letter_counting",
    "letter_jumble",
    "list_functions",
    "mahjong_puzzle",
    "manipulate_matrix",
    "maze",
    "mini_sudoku",
    "modulo_grid",
    "n_queens",
    "needle_haystack",
    "number_filtering",
    "number_format",
    "number_sequence",
    "number_sorting",
    "palindrome_generation",
    "palindrome_partitioning",
    "path_star",
    "polynomial_equations",
    "polynomial_multiplication",
    "pool_matrix",
    "power_function",
    "prime_factorization",
    "products",
    "propositional_logic",
    "puzzle24",
    "quantum_lock",
    "ransom_note",
    "rearc",
    "rectangle_count",
    "rotate_matrix",
    "rotten_oranges",
    "rubiks_cube",
    "rush_hour",
    "self_reference",
    "sentence_reordering",
    "shortest_path",
    "simple_equations",
    "simple_geometry",
    "simple_integration",
    "sokoban",
    "spell_backward",
    "spiral_matrix",
    "string_insertion",
    "string_manipulation",
    "string_splitting",
    "string_synthesis",
    "sudoku",
    "survo",
    "syllogism",
    "time_intervals",
    "tower_of_hanoi",
    "tsumego",
    "word_ladder",
    "word_sequence_reversal",
    "word_sorting",
    "zebra_puzzles",
)
MAX_ANSWER_CHARS = 10_000
RG_INSTRUCTION = "Put your final answer inside \\boxed{}."
#: Fields of an item's metadata that hold a correct answer when its "answer" is None (several are right).
_ORACLE_KEYS = ("possible_answer", "example_answer", "example_correct_answer")


class ConfigParam(Param):
    """``config``: a mapping of the dataset's own options, or None."""

    def allowed(self) -> str:
        return "a dict of the dataset's options (its config fields), or None (the defaults)"

    def check(self, name: str, value: Any, where: str = "") -> Any:
        if value is not None and not (isinstance(value, Mapping) and all(isinstance(k, str) for k in value)):
            raise invalid(name, value, self.allowed(), where, wrong_type=True)
        return value


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise GemError("rg:* envs need the reasoning-gym package: pip install -e '.[rg]'") from None
    return reasoning_gym


class ReasoningGymEnv(Env):
    """One reasoning-gym dataset (see the module docstring)."""

    params: ClassVar[dict[str, Param]] = {
        "name": Param(str),
        "size": Param(int, low=1, high=10**7),
        "seed": Param(int, low=0, high=2**62),
        "config": ConfigParam(str, none="the dataset's defaults"),
    }
    max_turns = 1
    #: The reset message is a dataset item's question: its length is the data's (the property tests know).
    prompt_from_data: ClassVar[bool] = True

    def __init__(self, name: str = "basic_arithmetic", size: int = 500, seed: int = 42, config: Mapping[str, Any] | None = None):
        from gem_core.registry import building_id

        self.env_id = building_id() or f"rg:{name}"
        self.name, self.size, self.base_seed = name, int(size), int(seed)
        self.config = dict(config or {})
        self._datasets: dict[int, Any] = {}
        self._dataset(0)  # build now: a bad name or config fails here, with the id
        self._next = 0
        self.entry: dict[str, Any] | None = None
        self.item: int | None = None
        self.done = True

    def _dataset(self, epoch: int) -> Any:
        dataset = self._datasets.get(epoch)
        if dataset is None:
            rg = _rg()
            if self.name not in rg.factory.DATASETS:
                raise invalid("name", self.name, "a reasoning-gym dataset name", self.env_id)
            try:
                dataset = rg.create_dataset(self.name, size=self.size, seed=self.base_seed + epoch, **self.config)
            except (TypeError, ValueError, AssertionError, KeyError) as exc:
                raise InvalidArgumentError(
                    f"{self.env_id}: config={echo(self.config)} is not allowed: {type(exc).__name__}: {str(exc)[:200]}",
                    name="config",
                    value=self.config,
                    allowed="the dataset's config fields",
                ) from None
            if len(self._datasets) > 2:
                self._datasets.pop(min(k for k in self._datasets if k != 0))
            self._datasets[epoch] = dataset
        return dataset

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        idx = options.get("idx") if isinstance(options, Mapping) else None
        if idx is not None:
            Param(int, low=0, high=self.size - 1).check("idx", idx, f"{self.env_id}: reset options")
            epoch, item = 0, int(idx)
        else:
            position = int(seed) if seed is not None else self._next
            self._next = position + 1
            epoch, item = divmod(position, self.size)
        self.entry = self._dataset(epoch)[item]
        self.item, self.epoch, self.done = item, epoch, False
        return str(self.entry["question"]) + "\n\n" + RG_INSTRUCTION, {"idx": item, "epoch": epoch}

    def __len__(self) -> int:
        return self.size

    def oracle_answer(self) -> str | None:
        """A correct answer to the current item: its "answer", else an example answer from its metadata."""
        if self.entry is None:
            return None
        answer = self.entry.get("answer")
        if answer is None:
            metadata = self.entry.get("metadata") or {}
            answer = next((metadata[k] for k in _ORACLE_KEYS if metadata.get(k) is not None), None)
        if answer is None:
            return None
        if isinstance(answer, (dict, list)):
            import json

            return json.dumps(answer)
        return str(answer)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done or self.entry is None:
            raise ResetNeeded(f"{self.env_id}: step() before reset() or after the episode ended; call reset()")
        self.done = True
        answer = last_boxed(action) if isinstance(action, str) else None
        if answer is None:
            info = {"correct": False, "format_error": True, "score": 0.0, "idx": self.item}
            return "Your answer was not graded: put it inside \\boxed{}.", 0.0, True, False, info
        info: dict[str, Any] = {"format_error": False, "idx": self.item}
        if len(answer) > MAX_ANSWER_CHARS:
            score = 0.0
            info["grading_error"] = f"answer longer than {MAX_ANSWER_CHARS} characters"
        else:
            try:
                score = float(self._dataset(self.epoch).score_answer(answer, self.entry))
            except Exception as exc:  # the dataset's scorer failed on this answer: it is not right
                score = 0.0
                info["grading_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        info.update(score=score, correct=score >= 1.0)
        verdict = "correct" if score >= 1.0 else ("partly correct" if score > 0 else "not correct")
        return f"Your answer {echo(answer)} is {verdict} (score {score:g}).", score, True, False, info

    def sample_random_action(self) -> str:
        return "\\boxed{" + str(int(self.np_random.integers(0, 100))) + "}"

    # the datasets are rebuilt from (name, size, seed, config), never copied
    def get_state(self) -> Any:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("_datasets", "spec")})

    def set_state(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state))

    def clone(self) -> Env:
        new = copy.copy(self)
        new.__dict__ = {"_datasets": self._datasets, **({"spec": self.__dict__["spec"]} if "spec" in self.__dict__ else {})}
        new.set_state(self.get_state())
        return new
