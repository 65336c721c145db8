"""RuleTaker: is a statement true, given facts and if-then rules? The real data when it can be had,
else theories generated here with the same shape.

``logic:RuleTaker-dN`` reads GEM's ``axon-rl/RuleTaker-dN-70k`` (``question``/``answer``, the answer in
``\\boxed{}``) through the dataset layer when given ``data_files=``, found under ``$GEM_DATA_DIR`` or on the
hub. Offline (``source="auto"``, the default) or with ``source="generated"`` it plays theories made by
:func:`generate_theory`: people with attributes (``Anne is big.``), rules with one or two conditions,
general (``If someone is big and is not red then they are kind.``) or about one person, negation as
failure (closed world: what does not follow is false, RuleTaker's CWA setting), and a question whose
answer needs a proof of exactly depth ``N`` rule applications -- or, half of the time, is about a
statement that a rule could conclude but none does (false, or true when negated). Rules are
stratified (a rule's conclusion comes after its conditions in a fixed order of the attributes), so
every theory has one model. Row ``i`` of the generated stream is the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gem_core.envs.datasets import DatasetUnavailableError
from gem_core.envs.qa_env import QaEnv
from gem_core.params import Param

NAMES = ("Anne", "Bob", "Charlie", "Dave", "Erin", "Fiona", "Gary", "Harry")
ATTRIBUTES = ("big", "blue", "cold", "furry", "green", "kind", "nice", "red", "rough", "round", "smart", "white", "young", "quiet")
MAX_DEPTH = 8


@dataclass(frozen=True)
class Rule:
    """``if pos (all held) and not neg (none held) then conclusion``; ``who``: one person, or anyone (None)."""

    pos: tuple[str, ...]
    neg: tuple[str, ...]
    conclusion: str
    who: str | None = None

    def text(self) -> str:
        if self.who is None:
            if len(self.pos) == 1 and not self.neg:
                return f"All {self.pos[0]} people are {self.conclusion}."
            conds = [f"is {a}" for a in self.pos] + [f"is not {a}" for a in self.neg]
            return f"If someone {' and '.join(conds)} then they are {self.conclusion}."
        conds = [f"{self.who} is {a}" for a in self.pos] + [f"{self.who} is not {a}" for a in self.neg]
        return f"If {' and '.join(conds)} then {self.who} is {self.conclusion}."


@dataclass
class Theory:
    facts: set[tuple[str, str]]
    rules: list[Rule]
    order: list[str]  # the attributes in stratification order
    people: list[str]
    statement: tuple[str, str, bool] = ("", "", False)  # (person, attribute, negated)
    answer: bool = False
    depth: int = 0
    model: dict[tuple[str, str], int] = field(default_factory=dict)  # provable atom -> its proof depth

    def text(self, rng: np.random.Generator) -> str:
        sentences = [f"{p} is {a}." for p, a in sorted(self.facts)] + [rule.text() for rule in self.rules]
        order = rng.permutation(len(sentences))
        person, attribute, negated = self.statement
        claim = f"{person} is {'not ' if negated else ''}{attribute}."
        return (
            " ".join(sentences[i] for i in order)
            + "\n\nAssume that anything that does not follow from the statements above is false. "
            + f"Is the following statement True or False?\n{claim}"
        )


def solve(facts: set[tuple[str, str]], rules: list[Rule], order: list[str], people: list[str]) -> dict[tuple[str, str], int]:
    """Every provable atom with its shortest proof depth (facts 0; a rule adds 1 to its deepest positive
    condition). Attributes are settled in ``order``, so a negated condition reads a finished attribute."""
    model = {atom: 0 for atom in facts}
    for attribute in order:  # a rule's conditions come before its conclusion in ``order``: one pass each
        for rule in rules:
            if rule.conclusion != attribute:
                continue
            for person in [rule.who] if rule.who else people:
                if any((person, a) not in model for a in rule.pos) or any((person, a) in model for a in rule.neg):
                    continue
                depth = 1 + max((model[(person, a)] for a in rule.pos), default=0)
                if depth < model.get((person, attribute), 1 << 30):
                    model[(person, attribute)] = depth
    return model


def generate_theory(depth: int, rng: np.random.Generator) -> Theory:
    """A theory with a question at proof depth ``depth`` (see the module docstring)."""
    for _attempt in range(1000):
        theory = _try_theory(depth, rng)
        if theory is not None:
            return theory
    raise RuntimeError(f"no RuleTaker theory of depth {depth} after 1000 attempts")  # pragma: no cover


def _try_theory(depth: int, rng: np.random.Generator) -> Theory | None:
    people = [str(p) for p in rng.choice(NAMES, size=3, replace=False)]
    order = [str(a) for a in rng.choice(ATTRIBUTES, size=min(len(ATTRIBUTES), max(depth + 5, 7)), replace=False)]
    hero = people[0]
    chain = sorted(rng.choice(len(order) - 1, size=depth + 1, replace=False).tolist()) if depth else [int(rng.integers(len(order)))]
    chain_names = {order[i] for i in chain}
    facts = {(hero, order[chain[0]])}
    rules: list[Rule] = []
    for low, high in zip(chain, chain[1:]):
        extra_pos: tuple[str, ...] = ()
        extra_neg: tuple[str, ...] = ()
        below = [a for a in order[:high] if a not in chain_names]
        kind = rng.random()
        if kind < 0.3 and below:
            extra = str(rng.choice(below))
            extra_pos = (extra,)
            facts.add((hero, extra))
        elif kind < 0.55 and below:
            extra_neg = (str(rng.choice(below)),)
        who = hero if rng.random() < 0.3 else None
        rules.append(Rule((order[low], *extra_pos), extra_neg, order[high], who))
    for _ in range(int(rng.integers(2, 5))):  # distractor facts
        facts.add((str(rng.choice(people)), str(rng.choice(order))))
    for _ in range(int(rng.integers(2, 5))):  # distractor rules
        i, j = sorted(rng.choice(len(order), size=2, replace=False).tolist())
        negated = rng.random() < 0.3
        rules.append(Rule(() if negated else (order[i],), (order[i],) if negated else (), order[j], None if rng.random() < 0.7 else str(rng.choice(people))))
    rules = list(dict.fromkeys(rules))
    model = solve(facts, rules, order, people)
    provable = [atom for atom, d in model.items() if d == depth]
    concluded = {rule.conclusion for rule in rules}
    unprovable = [(p, a) for p in people for a in order if (p, a) not in model and (depth == 0 or a in concluded)]
    want_provable = rng.random() < 0.5
    pool = provable if want_provable else unprovable
    if not pool or not provable:
        return None
    person, attribute = pool[int(rng.integers(len(pool)))]
    negated = bool(rng.random() < 0.5)
    theory = Theory(facts, rules, order, people, (person, attribute, negated), want_provable != negated, depth, model)
    return theory


class GeneratedRows:
    """A stream of generated RuleTaker rows that looks like a dataset table to :class:`DatasetEnv`."""

    column_names = ("question", "answer", "depth")

    def __init__(self, depth: int, seed: int, size: int = 10**9):
        self.depth, self.seed, self.size = depth, seed, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.Generator(np.random.PCG64([self.seed, self.depth, int(index)]))
        theory = generate_theory(self.depth, rng)
        return {"question": theory.text(rng), "answer": str(theory.answer), "depth": theory.depth}


class RuleTakerEnv(QaEnv):
    """``logic:RuleTaker-dN`` (see the module docstring). ``source``: ``"auto"`` (the dataset when it can be
    had, else generated theories), ``"dataset"`` (the dataset or an error) or ``"generated"``."""

    params: ClassVar[dict[str, Param]] = {
        **{k: v for k, v in QaEnv.params.items() if k != "extract_boxed"},
        "depth": Param(int, low=0, high=MAX_DEPTH),
        "source": Param(str, choices=("auto", "dataset", "generated")),
    }

    def __init__(
        self,
        depth: int = 0,
        dataset_name: str | None = None,
        split: str = "train",
        data_files: Any = None,
        question_key: str = "question",
        answer_key: str = "answer",
        seed: int = 0,
        shuffle: bool = True,
        source: str = "auto",
    ):
        self.depth = int(depth)
        if source != "generated":
            try:
                super().__init__(dataset_name, split, data_files, question_key, answer_key, seed, shuffle, extract_boxed=True)
                self.source = "dataset"
                return
            except DatasetUnavailableError:
                if source == "dataset" or data_files is not None:
                    raise
        from gem_core.registry import building_id

        self.env_id = building_id() or type(self).__name__
        self._setup(GeneratedRows(self.depth, int(seed)), "question", "answer", int(seed), False)  # rows already drawn at random
        self.extract_boxed = True
        self.source = "generated"
