"""The dataset layer of the task envs (gem_core.envs.datasets) through math ids: local files with
configurable fields, per-epoch seeded shuffling, reset(options={"idx": i}), eval:* in order, the one
offline error, shared tables; and the math env with the Python tool through a TaskSpec row."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("datasets", reason="dataset envs need the tasks extra")

import gem_core
from gem_core.envs.datasets import DatasetUnavailableError
from gem_core.envs.math_data import generate_math_rows, write_math_jsonl
from gem_core.errors import InvalidArgumentError, ResetNeeded


def _rows(path, rows):
    with open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return str(path)


@pytest.fixture
def qa_file(tmp_path):
    return _rows(tmp_path / "q.jsonl", [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(10)])


def test_local_jsonl_with_field_names(qa_file):
    env = gem_core.make("math:Math12K", data_files=qa_file, question_key="q", answer_key="a")
    observation, info = env.reset(options={"idx": 3})
    assert observation.startswith("What is 3 + 3?") and "\\boxed{}" in observation and info["idx"] == 3
    _obs, reward, terminated, truncated, info = env.step("so \\boxed{6}")
    assert (reward, terminated, truncated, info["correct"], info["format_error"]) == (1.0, True, False, True, False)
    with pytest.raises(ResetNeeded):
        env.step("\\boxed{6}")
    env.reset(options={"idx": 3})
    _obs, reward, *_rest, info = env.step("6")
    assert reward == 0.0 and info["format_error"]


def test_parquet_and_split_mapping(tmp_path):
    pd = pytest.importorskip("pandas")
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    pd.DataFrame({"problem": ["1+1?"], "answer": ["2"]}).to_parquet(train)
    pd.DataFrame({"problem": ["2+2?", "3+3?"], "answer": ["4", "6"]}).to_parquet(test)
    env = gem_core.make("eval:MATH500", data_files={"train": str(train), "test": str(test)}, split="test")
    assert len(env) == 2
    assert env.reset(options={"idx": 1})[0].startswith("3+3?")
    with pytest.raises(InvalidArgumentError, match="split='dev'"):
        gem_core.make("eval:MATH500", data_files={"test": str(test)}, split="dev")


def test_shuffling_is_seeded_per_epoch(tmp_path):
    path = write_math_jsonl(tmp_path / "m.jsonl", 12)
    env = gem_core.make("math:GSM8K", data_files=str(path))
    epoch0 = [env.reset()[1]["idx"] for _ in range(12)]
    epoch1 = [env.reset()[1]["idx"] for _ in range(12)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))  # each row once per epoch
    assert epoch0 != epoch1 and epoch0 != list(range(12))  # a new order each epoch
    again = gem_core.make("math:GSM8K", data_files=str(path))
    assert [again.reset(seed=s)[1]["idx"] for s in range(24)] == epoch0 + epoch1  # seed s = position s
    other = gem_core.make("math:GSM8K", data_files=str(path), seed=1)
    assert [other.reset()[1]["idx"] for _ in range(12)] != epoch0
    after = again.reset()[1]["idx"]  # reset() goes on after the last seeded position: position 24
    assert after == gem_core.make("math:GSM8K", data_files=str(path)).reset(seed=24)[1]["idx"]


def test_idx_and_eval_sets_in_order(tmp_path):
    path = write_math_jsonl(tmp_path / "m.jsonl", 5)
    env = gem_core.make("eval:AIME24", data_files=str(path))
    assert len(env) == 5
    assert [env.reset()[1]["idx"] for _ in range(7)] == [0, 1, 2, 3, 4, 0, 1]
    rows = generate_math_rows(5)
    for i, row in enumerate(rows):
        observation, info = env.reset(options={"idx": i})
        assert observation.startswith(row["problem"]) and env.answer() == row["answer"]
        assert env.step("\\boxed{" + row["answer"] + "}")[1] == 1.0
    with pytest.raises(InvalidArgumentError, match="idx=5"):
        env.reset(options={"idx": 5})


def test_offline_without_data_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("GEM_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as caught:
        gem_core.make("math:Orz57K")
    assert time.monotonic() - start < 60  # no download retries (minutes); room for a loaded machine's imports
    message = str(caught.value)
    assert "\n" not in message
    assert "math:Orz57K" in message and "axon-rl/ORZ-57k" in message and "data_files=" in message


def test_bad_files_and_fields(tmp_path, qa_file):
    with pytest.raises(InvalidArgumentError, match="does not"):
        gem_core.make("math:Math12K", data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(InvalidArgumentError, match="ending in"):
        gem_core.make("math:Math12K", data_files=_rows(tmp_path / "x.txt", []))
    with pytest.raises(InvalidArgumentError, match="question_key='problem'.*'q', 'a'"):
        gem_core.make("math:Math12K", data_files=qa_file)
    with pytest.raises(InvalidArgumentError, match="data_files"):
        gem_core.make("math:Math12K", data_files=[])


def test_envs_share_one_table_and_clones_do_not_copy_it(qa_file):
    envs = [gem_core.make("math:Math12K", data_files=qa_file, question_key="q", answer_key="a") for _ in range(3)]
    assert envs[0].data is envs[1].data is envs[2].data
    envs[0].reset(seed=4)
    clone = envs[0].clone()
    assert clone.data is envs[0].data and clone.answer() == envs[0].answer()
    assert clone.step("\\boxed{" + clone.answer() + "}")[1] == 1.0
    assert not envs[0].done  # the original episode is untouched


def test_generated_arithmetic_is_offline_and_oracle_answers_are_correct():
    env = gem_core.make("math:Arithmetic-v0")
    for seed in range(8):
        env.reset(seed=seed)
        assert env.step("\\boxed{" + env.answer() + "}")[1] == 1.0


def test_math_with_the_python_tool_through_a_task_spec(qa_file):
    from gem_core.tasks import TaskSpec

    sys_path = __import__("sys").path
    sys_path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tools"))
    from sandbox_support import require_bwrap

    require_bwrap()
    spec = TaskSpec("math:Math12K", seed=0, tools=("python",), env_kwargs={"data_files": qa_file, "question_key": "q", "answer_key": "a"})
    env = spec.make_env()
    try:
        observation, _ = env.reset(seed=0)
        assert "<python>" in observation
        question = observation.split("?")[0]
        number = int(question.split()[-1])
        observation, reward, terminated, _truncated, info = env.step(f"<python>print({number} + {number})</python>")
        assert str(2 * number) in observation and not terminated and info["tool_calls"] == 1
        _obs, reward, terminated, _truncated, info = env.step(f"\\boxed{{{2 * number}}}")
        assert reward == 1.0 and terminated and info["tool_calls"] == 1
    finally:
        env.close()


def test_async_vector_env_of_a_math_id(tmp_path):
    """Worker processes load the rows themselves (data_files travels as a kwarg) and grade with their own
    per-process pool: symbolic answers reach math-verify there."""
    path = tmp_path / "sym.jsonl"
    path.write_text("".join(json.dumps({"problem": f"Simplify sqrt({2 * k * k}).", "answer": f"{k}\\\\sqrt{{2}}"}) + "\n" for k in range(2, 6)))
    vec = gem_core.make_vec("math:Math12K", 4, vectorization_mode="async", vector_kwargs={"num_workers": 2}, data_files=str(path))
    try:
        _obs, infos = vec.reset(seed=0)
        ks = [int(o.split("sqrt(")[1].split(")")[0]) for o in _obs]
        answers = ["\\\\boxed{\\\\sqrt{" + str(k) + "}}" for k in ks]
        _obs, rewards, terminated, _truncated, infos = vec.step(answers)
        assert list(rewards) == [1.0] * 4 and all(terminated)
    finally:
        vec.close()


def test_hub_probe(monkeypatch):
    from gem_core.envs import datasets as layer

    monkeypatch.setattr(layer, "_hub_reachable", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert layer.hub_reachable() is False and layer._hub_reachable is None  # no probe at all
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    start = time.monotonic()
    assert layer.hub_reachable() is False and time.monotonic() - start < layer.HUB_PROBE_TIMEOUT_S + 10  # room for load
    monkeypatch.setattr(layer, "_hub_reachable", None)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert layer.hub_reachable() is True
