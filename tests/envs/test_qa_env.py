"""QA envs: exact match on <answer> with F1 in info, the QA eval sets in order, and the search tool
through a TaskSpec row over gem_core's own small corpus."""

from __future__ import annotations

import pytest

pytest.importorskip("datasets", reason="dataset envs need the tasks extra")

import gem_core
from gem_core.envs.qa_data import qa_rows, write_qa_files


@pytest.fixture
def qa_files(tmp_path):
    return write_qa_files(tmp_path, n=5)


def test_exact_match_reward_and_f1(qa_files):
    _corpus, questions = qa_files
    env = gem_core.make("qa:HotpotQA", data_files=str(questions), question_key="question")
    observation, _ = env.reset(options={"idx": 0})
    row = qa_rows(5)[0]
    assert observation.startswith(row["question"]) and "<answer>" in observation
    gold = row["answer"][0]
    _obs, reward, terminated, _tr, info = env.step(f"<think>...</think><answer>the {gold.lower()}.</answer>")
    assert (reward, terminated, info["correct"], info["f1"], info["format_error"]) == (1.0, True, True, 1.0, False)
    env.reset(options={"idx": 0})
    _obs, reward, *_rest, info = env.step(f"<answer>{gold} city</answer>")
    assert reward == 0.0 and 0 < info["f1"] < 1
    env.reset(options={"idx": 0})
    _obs, reward, *_rest, info = env.step(gold)
    assert reward == 0.0 and info["format_error"]


def test_qa_eval_sets_iterate_in_order(qa_files):
    _corpus, questions = qa_files
    env = gem_core.make("eval:Bamboogle", data_files=str(questions))
    assert len(env) == 15
    assert [env.reset()[1]["idx"] for _ in range(4)] == [0, 1, 2, 3]


def test_every_qa_id_makes_from_the_local_copies():
    for env_id in [i for i in gem_core.list_envs() if gem_core.spec(i).entry_point.startswith("gem_core.envs.qa_env")]:
        env = gem_core.make(env_id)
        env.reset(seed=0)
        assert env.step("<answer>" + str(env.answer()[0]) + "</answer>")[1] == 1.0, env_id


def test_search_tool_through_a_task_spec(qa_files, monkeypatch):
    pytest.importorskip("bm25s")
    from gem_core.tasks import TaskSpec

    corpus, questions = qa_files
    monkeypatch.setenv("GEM_SEARCH_CORPUS", str(corpus))
    spec = TaskSpec("qa:NaturalQuestions", seed=0, tools=("search",), env_kwargs={"data_files": str(questions)})
    env = spec.make_env()
    try:
        observation, _ = env.reset(options={"idx": 0})
        assert "<search>" in observation
        country = qa_rows(5)[0]["question"].split()[-1].rstrip("?")
        observation, reward, terminated, _tr, info = env.step(f"<search>capital of {country}</search>")
        capital = qa_rows(5)[0]["answer"][0]
        assert capital in observation and not terminated and info["tool_calls"] == 1
        _obs, reward, terminated, _tr, info = env.step(f"<answer>{capital}</answer>")
        assert reward == 1.0 and terminated and info["tool_calls"] == 1
    finally:
        env.close()
