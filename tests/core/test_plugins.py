"""The plugin base: version checks, patches that put back exactly what was there, the engine adapter."""

from __future__ import annotations

import asyncio
import types

import pytest

from gem_core.plugins import EnginePolicy, Patch, PluginError, TrainerPlugin, discover, finish_reason, version_matches
from gem_core.rollout import SamplingParams


class Maker:
    def compute(self, x):
        return ("original", x)

    def other(self):
        return "other"


def _wrap(original):
    def compute(self, x):
        return ("patched", original(self, x))

    return compute


def test_patch_applies_once_and_reverts_exactly(monkeypatch):
    module = types.ModuleType("gem_fake_trainer")
    module.Maker = Maker
    monkeypatch.setitem(__import__("sys").modules, "gem_fake_trainer", module)
    original = Maker.__dict__["compute"]
    patch = Patch("gem_fake_trainer:Maker", "compute", _wrap)
    patch.apply()
    patch.apply()  # idempotent: not wrapped twice
    assert Maker().compute(1) == ("patched", ("original", 1)) and patch.applied
    assert patch.revert() and Maker.__dict__["compute"] is original and not patch.applied
    assert Maker().compute(1) == ("original", 1)


def test_revert_leaves_a_later_patch_alone(monkeypatch):
    module = types.ModuleType("gem_fake_trainer2")
    module.Maker = type("Maker", (), {"compute": lambda self, x: x})
    monkeypatch.setitem(__import__("sys").modules, "gem_fake_trainer2", module)
    patch = Patch("gem_fake_trainer2:Maker", "compute", _wrap)
    patch.apply()
    later = lambda self, x: "someone else"  # noqa: E731
    module.Maker.compute = later
    assert patch.revert() is False and module.Maker.compute is later


def test_missing_target_is_a_clear_error():
    with pytest.raises(PluginError, match="does not exist in this version"):
        Patch("gem_core.plugins:Patch", "no_such_method", _wrap).apply()
    with pytest.raises(PluginError, match="cannot patch"):
        Patch("gem_core_no_such_module:X", "y", _wrap).apply()


def test_an_optional_patch_is_nothing_where_its_version_lacks_the_target(monkeypatch):
    """A patch of what only some supported versions have (RL2 0.0.2's ``PPOTrainer.get_dataloader``, not at HEAD):
    absent there, it applies as nothing and counts as applied; where the target exists it patches as any other."""
    module = types.ModuleType("gem_fake_trainer4")
    module.Maker = type("Maker", (), {"compute": lambda self, x: ("original", x)})
    monkeypatch.setitem(__import__("sys").modules, "gem_fake_trainer4", module)
    for target in ("gem_fake_trainer4:Maker", "gem_fake_trainer4:NoSuchClass"):
        missing = Patch(target, "missing", _wrap, optional=True)
        missing.apply()
        assert missing.absent() and missing.applied and missing.revert() and not hasattr(module.Maker, "missing")
    present = Patch("gem_fake_trainer4:Maker", "compute", _wrap, optional=True)
    present.apply()
    assert not present.absent() and module.Maker().compute(1) == ("patched", ("original", 1)) and present.applied
    assert present.revert() and module.Maker().compute(1) == ("original", 1)
    with pytest.raises(PluginError, match="does not exist in this version"):  # not optional: still an error
        Patch("gem_fake_trainer4:NoSuchClass", "compute", _wrap).apply()
    with pytest.raises(PluginError, match="cannot patch"):  # optional, but the module itself must import
        Patch("gem_core_no_such_module:X", "y", _wrap, optional=True).apply()


def test_install_rolls_back_when_a_patch_fails(monkeypatch):
    module = types.ModuleType("gem_fake_trainer3")
    module.Maker = type("Maker", (), {"compute": lambda self, x: x})
    monkeypatch.setitem(__import__("sys").modules, "gem_fake_trainer3", module)
    original = module.Maker.__dict__["compute"]
    plugin = TrainerPlugin(
        "fake",
        "pip",
        ">=1",
        "gem_fake_trainer3",
        patches=[Patch("gem_fake_trainer3:Maker", "compute", _wrap), Patch("gem_fake_trainer3:Maker", "missing", _wrap)],
    )
    with pytest.raises(PluginError):
        plugin.install()
    assert module.Maker.__dict__["compute"] is original


def test_version_check_names_what_to_install():
    plugin = TrainerPlugin("fake", "gem-core-no-such-dist", ">=1,<2", "x")
    with pytest.raises(PluginError, match="not installed"):
        plugin.check_version()
    pip = TrainerPlugin("pip", "pip", ">=1000", "pip")
    with pytest.raises(PluginError, match="is not supported"):
        pip.check_version()
    assert version_matches("0.9.1", ">=0.9,<0.10") and not version_matches("0.10.0", ">=0.9,<0.10")


def test_engine_policy_keeps_the_stop_token_and_reads_vllm_finish_reasons():
    from gem_core.testing import build_test_tokenizer
    from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMSamplingParams

    tokenizer = build_test_tokenizer()
    engine = VLLMFaithfulEngine(ScriptedModel(tokenizer, lambda context: "I guess \\boxed{5}."), max_model_len=256)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class Adapter(EnginePolicy):
        async def request(self, prompt_ids, params, request_id):
            return await engine.generate(
                prompt_ids,
                VLLMSamplingParams(
                    **{k: v for k, v in self.vllm_params(params).items() if k in ("max_tokens", "stop_token_ids", "temperature", "top_p", "top_k")}
                ),
            )

    prompt = tokenizer.encode("hello", add_special_tokens=False)
    full = asyncio.run(Adapter().generate(prompt, SamplingParams(max_tokens=64, stop_token_ids=(stop,))))
    assert full.token_ids[-1] == stop and full.finish_reason == "stop"
    cut = asyncio.run(Adapter().generate(prompt, SamplingParams(max_tokens=3, stop_token_ids=(stop,))))
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"
    # an engine that says "completed" for a response it cut at max_tokens (verl's TokenOutput)
    assert finish_reason(types.SimpleNamespace(stop_reason="completed"), [1, 2, 3], SamplingParams(max_tokens=3, stop_token_ids=(9,))) == "length"
    assert finish_reason(types.SimpleNamespace(stop_reason="completed"), [1, 9], SamplingParams(max_tokens=2, stop_token_ids=(9,))) == "stop"
    assert finish_reason(types.SimpleNamespace(stop_reason="aborted"), [], SamplingParams()) == "abort"


def test_discover_finds_no_trainer_imports():
    import sys

    plugins = discover()
    assert all(isinstance(p, TrainerPlugin) for p in plugins.values())
    assert "verl" not in sys.modules and "openrlhf" not in sys.modules


def test_when_imported_runs_after_the_first_import_only(tmp_path, monkeypatch):
    import sys

    from gem_core.plugins import cancel_when_imported, waiting_for_import, when_imported

    (tmp_path / "gem_late_module.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def bump(module):
        seen.append(module.VALUE)
        module.VALUE += 1

    when_imported("gem_late_module", bump)
    when_imported("gem_late_module", bump)  # not added twice
    assert waiting_for_import("gem_late_module") and "gem_late_module" not in sys.modules
    import gem_late_module  # noqa: F401

    assert seen == [41] and gem_late_module.VALUE == 42 and not waiting_for_import("gem_late_module")
    when_imported("gem_late_module", bump)  # already loaded: runs now
    assert seen == [41, 42]
    when_imported("gem_never_imported_module", bump)
    cancel_when_imported("gem_never_imported_module")
    assert not waiting_for_import("gem_never_imported_module")
    sys.modules.pop("gem_late_module", None)
