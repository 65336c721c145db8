"""gem-core eval --policy hf: a tiny local model (built and saved here, nothing downloaded), batched."""

from __future__ import annotations

import pytest
from eval_support import EASY, read_lines, without_timing

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.cli import build_parser, main  # noqa: E402


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


def test_a_vision_language_model_gets_its_processor_or_one_line(tmp_path, capsys):
    """A model directory with an image processor (the tiny LLaVA of gem_core.testing.vision): `--policy vllm`
    renders with its processor (VLChatFormatter, images through); `--policy hf` (text only) refuses in one line."""
    pytest.importorskip("PIL")
    from gem_core.eval.policies import _formatter
    from gem_core.rollout import VLChatFormatter
    from gem_core.testing.vision import save_tiny_vl

    vl_dir = save_tiny_vl(tmp_path / "tiny-vl")
    capsys.readouterr()  # transformers' progress bar while saving
    assert isinstance(_formatter(vl_dir, None), VLChatFormatter)
    assert main(["eval", "vision:Geometry-v0", "--policy", "hf", "--model", vl_dir, "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "vision-language model: use --policy vllm" in err


def test_the_meter_passes_images_through_and_keeps_a_text_call_as_it_was():
    import asyncio

    from gem_core.eval.policies import EpisodeMeter, _MeteredTokens
    from gem_core.rollout import Generation, SamplingParams

    calls = []

    class Engine:
        async def generate(self, prompt_ids, params, *, request_id="", **images):
            calls.append(images)
            return Generation([1], None, "stop", text="x")

    metered = _MeteredTokens(EpisodeMeter(Engine()))
    asyncio.run(metered.generate([5, 6], SamplingParams(), request_id="r"))
    asyncio.run(metered.generate([5, 6], SamplingParams(), request_id="r", multi_modal_data={"image": ["img"]}))
    assert calls == [{}, {"multi_modal_data": {"image": ["img"]}}]


def test_the_meter_hands_an_engines_context_refusal_to_the_runner_not_a_failed_request():
    """vLLM refuses an over-long prompt in its own words (not ContextLimitExceeded): the runner ends that
    episode as its context limit, so the meter must pass the error on instead of counting a failed request."""
    import asyncio

    import pytest

    from gem_core.eval.policies import EpisodeMeter, _MeteredTokens
    from gem_core.rollout import SamplingParams, is_context_refusal

    refusal = "The decoder prompt (length 2049) is longer than the maximum model length of 2048."

    class Engine:
        async def generate(self, prompt_ids, params, *, request_id="", **images):
            raise ValueError(refusal)

    meter = EpisodeMeter(Engine())
    with pytest.raises(ValueError) as raised:
        asyncio.run(_MeteredTokens(meter).generate([5] * 2049, SamplingParams(), request_id="r"))
    assert is_context_refusal(raised.value)
    assert meter.error is None and meter.last_finish is None  # not a failed request

    class Broken:
        async def generate(self, prompt_ids, params, *, request_id="", **images):
            raise RuntimeError("engine died")

    broken = EpisodeMeter(Broken())
    generation = asyncio.run(_MeteredTokens(broken).generate([5], SamplingParams(), request_id="r"))
    assert generation.finish_reason == "abort" and broken.error == "RuntimeError: engine died"


def test_stop_after_box_plays_as_a_run_trained_with_it(model_dir):
    # gem-core eval --stop-after-box: each response ends at the model's first token holding a "}" (what
    # rollout.stop_after_box trained with), the template's end of turn first; without it the brace is no stop
    from gem_core.eval.cli import _prepare
    from gem_core.testing import build_test_tokenizer

    brace = build_test_tokenizer("chatml").convert_tokens_to_ids("}")
    parse = build_parser().parse_args
    argv = ["eval", "run", EASY, "--policy", "hf", "--model", model_dir, "--episodes", "1"]
    _, policy, config = _prepare(parse([*argv, "--stop-after-box"]))
    assert config.params.stop_token_ids[0] == policy.formatter.stop_token_ids[0] and brace in config.params.stop_token_ids
    _, _, plain = _prepare(parse(argv))
    assert brace not in plain.params.stop_token_ids
