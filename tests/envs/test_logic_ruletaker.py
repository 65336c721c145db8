"""logic:RuleTaker-dN: generated theories checked by a small independent checker that reads only the
text the model sees; the real-data path through data_files."""

from __future__ import annotations

import json
import re
from graphlib import TopologicalSorter

import pytest

import gem_core
from gem_core.envs.datasets import DatasetUnavailableError

DEPTHS = (0, 1, 2, 3, 5)


def check(question: str) -> tuple[bool, int | None]:
    """The answer to a RuleTaker question and the claim's proof depth (None: not provable), from its text:
    parse facts and rules, settle attributes in dependency order (closed world), shortest proofs."""
    theory, _, claim = question.partition("\n\nAssume")
    claim = next(line for line in claim.splitlines() if re.fullmatch(r"\w+ is (not )?\w+\.", line))
    facts, rules, people = set(), [], set()
    for sentence in re.findall(r"[^.]+\.", theory):
        sentence = sentence.strip()
        if m := re.fullmatch(r"(\w+) is (\w+)\.", sentence):
            facts.add(m.groups())
            people.add(m[1])
        elif m := re.fullmatch(r"All (\w+) people are (\w+)\.", sentence):
            rules.append((None, [(m[1], False)], m[2]))
        elif m := re.fullmatch(r"If someone (.+) then they are (\w+)\.", sentence):
            conds = [(c.split()[-1], c.startswith("is not")) for c in m[1].split(" and ")]
            rules.append((None, conds, m[2]))
        elif m := re.fullmatch(r"If (\w+) (.+) then (\w+) is (\w+)\.", sentence):
            who = m[3]
            conds = [(c.split()[-1], " is not " in f" {c} ") for c in f"{m[1]} {m[2]}".split(" and ")]
            rules.append((who, conds, m[4]))
            people.add(who)
        else:
            raise AssertionError(f"unparsed sentence {sentence!r}")
    m = re.fullmatch(r"(\w+) is (not )?(\w+)\.", claim)
    assert m, claim
    person, negated, attribute = m[1], bool(m[2]), m[3]
    people.add(person)
    graph: dict[str, set[str]] = {}
    for _who, conds, conclusion in rules:
        graph.setdefault(conclusion, set()).update(a for a, _ in conds)
    depth = {fact: 0 for fact in facts}
    for attr in TopologicalSorter(graph).static_order():  # raises on a cycle: theories must be stratified
        for who, conds, conclusion in rules:
            if conclusion != attr:
                continue
            for p in [who] if who else sorted(people):
                if all(((p, a) in depth) != neg for a, neg in conds):
                    d = 1 + max([depth[(p, a)] for a, neg in conds if not neg], default=0)
                    depth[(p, attr)] = min(d, depth.get((p, attr), d))
    proof = depth.get((person, attribute))
    return (proof is not None) != negated, proof


@pytest.mark.parametrize("depth", DEPTHS)
def test_generated_theories_agree_with_the_checker(depth, monkeypatch):
    monkeypatch.delenv("GEM_DATA_DIR", raising=False)  # no local copy: offline, the id generates
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    env = gem_core.make(f"logic:RuleTaker-d{depth}")
    assert env.source == "generated"
    answers = set()
    for seed in range(40):
        observation, _info = env.reset(seed=seed)
        answer, proof = check(observation)
        assert str(answer) == env.answer(), observation
        assert proof is None or proof == depth, observation
        answers.add(answer)
        assert env.step("\\boxed{" + env.answer() + "}")[1] == 1.0
    assert answers == {True, False}


def test_a_deep_claim_needs_its_chain():
    """Some depth-5 claims are provable and need all five rules."""
    env = gem_core.make("logic:RuleTaker-d5", source="generated")
    proofs = [check(env.reset(seed=s)[0])[1] for s in range(30)]
    assert proofs.count(5) >= 5


def test_the_same_row_everywhere_and_wrong_answers():
    a, b = gem_core.make("logic:RuleTaker-d2", source="generated"), gem_core.make("logic:RuleTaker-d2", source="generated")
    assert a.reset(seed=7) == b.reset(seed=7)
    wrong = "False" if a.answer() == "True" else "True"
    _obs, reward, _t, _tr, info = a.step(f"\\boxed{{{wrong}}}")
    assert reward == 0.0 and not info["correct"]
    b.step("True")
    assert b.reset(seed=7)[0] == a.reset(seed=7)[0]


def test_real_data_through_data_files(tmp_path):
    path = tmp_path / "ruletaker.jsonl"
    path.write_text(json.dumps({"question": "Anne is big. Is Anne big?", "answer": "True"}) + "\n")
    env = gem_core.make("logic:RuleTaker-d0", data_files=str(path))
    assert env.source == "dataset" and env.reset(seed=0)[0].startswith("Anne is big.")
    assert env.step("\\boxed{true}")[1] == 1.0  # SQuAD normalisation: case does not matter


def test_source_dataset_offline_is_the_clear_error(monkeypatch):
    monkeypatch.delenv("GEM_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetUnavailableError, match="logic:RuleTaker-d3.*data_files="):
        gem_core.make("logic:RuleTaker-d3", source="dataset")
