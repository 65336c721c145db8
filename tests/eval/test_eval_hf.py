"""gem-core eval --policy hf: a tiny local model (built and saved here, nothing downloaded), batched."""

from __future__ import annotations

import pytest
from eval_support import EASY, read_lines, without_timing

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from gem_core.testing import build_test_tokenizer, build_tiny_model

    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_test_tokenizer("chatml")
    build_tiny_model(len(tokenizer), seed=0, hidden_size=32, num_layers=1).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_a_local_model_plays_counted_reproducible_episodes(model_dir, tmp_path, capsys):
    argv = ["eval", EASY, "--policy", "hf", "--model", model_dir, "--episodes", "4", "--concurrency", "4", "--max-tokens", "6", "--temperature", "1"]
    assert main([*argv, "--out", str(tmp_path / "a.jsonl"), "--save-transcripts"]) == 0
    assert main([*argv, "--out", str(tmp_path / "b.jsonl"), "--save-transcripts"]) == 0
    a, b = read_lines(tmp_path / "a.jsonl"), read_lines(tmp_path / "b.jsonl")
    assert without_timing(a) == without_timing(b)  # sampling is seeded by the (stable) episode ids
    assert [line["seed"] for line in a] == [0, 1, 2, 3] and {line["model"] for line in a} == {model_dir}
    for line in a:
        assert line["error"] is None and line["turns"] >= 1
        assert 0 < line["tokens_out"] <= 6 * line["turns"] and line["tokens_in"] > 0
        assert len(line["transcript"]["turns"]) == line["turns"]
    assert len({line["transcript"]["turns"][0]["response"] for line in a}) > 1  # each episode samples its own
    assert f"4 episodes (4 played now) with {model_dir}" in capsys.readouterr().out


def test_a_missing_model_directory_is_one_line(tmp_path, capsys):
    assert main(["eval", EASY, "--policy", "hf", "--model", str(tmp_path / "none"), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "cannot load a model from" in err


def test_the_vllm_policy_without_a_model_or_without_vllm_is_one_line(tmp_path, capsys):
    """`--policy vllm` plays on vLLM's engine (tests/real: the same episodes as `--policy hf`); its bad uses."""
    import importlib.util

    assert main(["eval", EASY, "--policy", "vllm", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "--policy vllm needs --model PATH" in err
    if importlib.util.find_spec("vllm") is None:
        assert main(["eval", EASY, "--policy", "vllm", "--model", str(tmp_path / "none"), "--episodes", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--policy vllm needs vLLM: pip install" in err
    else:
        assert main(["eval", EASY, "--policy", "vllm", "--model", str(tmp_path / "none"), "--episodes", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot load a tokenizer from" in err
