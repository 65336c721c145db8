"""QA grading: SQuAD normalisation, exact match, F1 and the <answer> tag."""

from __future__ import annotations

import pytest

from gem_core.grading.qa import exact_match, f1_score, last_answer_tag, normalize_answer

NORMALISATION = [
    ("The Eiffel Tower", "eiffel tower"),
    ("  Paris. ", "paris"),
    ("a cat, an owl & the dog!", "cat owl dog"),
    ("U.S.A.", "usa"),
    ("Theory of everything", "theory of everything"),  # 'the' only as a word
    ("1,000", "1000"),
    ("Hello\n\tworld", "hello world"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "normal"), NORMALISATION)
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


EXACT = [
    ("Paris", ["Paris"], True),
    ("paris", "Paris", True),
    ("the Paris", ["Paris"], True),
    ("London", ["Paris"], False),
    ("Berlin", ["Paris", "Berlin", "Rome"], True),
    ("Paris, France", ["Paris"], False),
    ("1990", 1990, True),
    ("x" * 5000, ["x" * 5000], False),  # too long to be an answer
]


@pytest.mark.parametrize(("prediction", "gold", "expected"), EXACT)
def test_exact_match(prediction, gold, expected):
    assert exact_match(prediction, gold) is expected


def test_f1():
    assert f1_score("Paris France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    assert f1_score("Rome", ["Paris", "Paris Rome"]) == pytest.approx(2 / 3)
    assert f1_score("nothing", ["Paris"]) == 0.0


def test_answer_tag():
    assert last_answer_tag("<think>x</think><answer>Paris</answer>") == "Paris"
    assert last_answer_tag("<answer>a</answer> then <answer>b</answer>") == "b"
    assert last_answer_tag("<answer>a</answer> then <answer>b") == "a"
    assert last_answer_tag("no tag") is None and last_answer_tag(None) is None
