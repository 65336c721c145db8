"""The Policy protocol: token ids in, token ids out (DESIGN.md contract 3).

A trainer plugin implements :class:`Policy` by wrapping its own inference engine (verl's server manager,
an OpenRLHF vLLM engine, ...); the episode runner only ever calls ``generate``. A policy that talks to a
chat endpoint in text (evaluation against a served model) implements :class:`ChatPolicy` instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")
_REQUEST_SEPARATOR = "/turn-"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. Engines map these onto their own names (vLLM's are the same).

    ``max_tokens`` bounds the response of one turn; the runner lowers it further so the context never
    exceeds its ``max_context_tokens``. ``stop_token_ids`` end a response (the stop token is part of the
    response); the runner adds the chat template's end-of-turn token to it. ``temperature=0`` means
    greedy. ``top_k=0`` and ``top_p=1`` turn those filters off. ``seed`` feeds the policies that sample
    locally (with the request id, so every request draws its own stream). ``extra`` carries anything
    engine-specific, untouched.
    """

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``extra`` merged in), e.g. for an engine's sampling kwargs."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        out["stop_token_ids"] = list(self.stop_token_ids)
        out.update(self.extra)
        return out


@dataclass
class Generation:
    """One response: its token ids, the log-probability of each, and why it ended.

    ``finish_reason``: ``"stop"`` (a stop token, included in ``token_ids``, or the model's EOS),
    ``"length"`` (``max_tokens`` reached; the response lacks its end-of-turn token), ``"abort"`` (the
    engine gave up, e.g. during a weight sync; the runner ends the episode without stepping the env).
    ``logprobs`` is ``None`` when the engine does not report them. ``text`` is set by text-only
    (chat) policies, which have no token ids. ``prompt_tokens``/``completion_tokens``: what a chat
    endpoint reported using for the request (its ``usage``), ``None`` when it said nothing.
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    text: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        self.token_ids = list(self.token_ids)
        if self.logprobs is not None:
            self.logprobs = [float(x) for x in self.logprobs]
            if len(self.logprobs) != len(self.token_ids):
                raise ValueError(f"logprobs has {len(self.logprobs)} entries for {len(self.token_ids)} tokens")


class ContextLimitExceeded(Exception):
    """Raised by a policy whose engine refuses a prompt as longer than its context window; the runner
    ends the episode as truncated with reason ``"context_limit"`` instead of failing."""


#: How engines word the refusal of a prompt longer than the model's context window:
#: vLLM's input processor, every version ("The decoder prompt (length N) is longer than the maximum model
#: length of M", and from 0.29 "... (length N) plus the number of requested output tokens (at least 1) is
#: longer than the maximum model length of M"); vLLM 0.29+'s prompt checks and its OpenAI server ("This
#: model's maximum context length is M tokens. However, ..."); verl 0.9's servers ("Prompt length (N) leaves
#: no room to generate within the model's maximum context length (M)", "... exceeds the model's maximum
#: context length (M)"); SGLang ("The input (N tokens) is longer than the model's context length (M tokens)").
CONTEXT_REFUSAL = re.compile(r"longer than the maximum model length|maximum context length|longer than the model's context length", re.IGNORECASE)


def is_context_refusal(error: BaseException) -> bool:
    """True when ``error`` is an engine's refusal of a prompt longer than its context window: a
    :class:`ContextLimitExceeded`, or an error (or one it was raised from, e.g. Ray's ``RayTaskError``
    around a server's error) in the words of :data:`CONTEXT_REFUSAL`. The runner ends such an episode as
    truncated (``"context_limit"``); any other error still fails it."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ContextLimitExceeded) or CONTEXT_REFUSAL.search(str(current)):
            return True
        cause = getattr(current, "cause", None)  # Ray's RayTaskError keeps the remote error here
        pending.extend([current.__cause__, current.__context__, cause if isinstance(cause, BaseException) else None])
    return False


def answer_each(items: Sequence[Any], generate: Callable[[Sequence[Any]], Sequence[Any]]) -> list[Any]:
    """``generate(items)``, one batched engine call, answer ``i`` for item ``i``. vLLM checks every prompt of
    a call before it runs any and refuses the whole call for one prompt over its context window; then the
    batch is split in halves until each refusal is down to its own item, whose answer is that refusal as a
    :class:`ContextLimitExceeded` (the other items are answered as usual). Any other error is raised."""
    try:
        answers = list(generate(items))
    except Exception as exc:
        if not is_context_refusal(exc):
            raise
        if len(items) == 1:
            return [exc if isinstance(exc, ContextLimitExceeded) else _context_limit(exc)]
        middle = len(items) // 2
        return answer_each(items[:middle], generate) + answer_each(items[middle:], generate)
    if len(answers) != len(items):
        raise RuntimeError(f"the engine answered {len(answers)} of {len(items)} requests")
    return answers


def _context_limit(error: BaseException) -> ContextLimitExceeded:
    refusal = ContextLimitExceeded(str(error))
    refusal.__cause__ = error
    return refusal


@runtime_checkable
class Policy(Protocol):
    """Token in, token out. ``request_id`` is ``"{episode_id}/turn-{t}"``: stable across reruns, so a
    plugin can route every turn of an episode to the same server (:func:`episode_of` gives the episode)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation: ...


@runtime_checkable
class ChatPolicy(Protocol):
    """Text in, text out, for chat endpoints where token ids are not needed (evaluation)."""

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams, *, request_id: str = "") -> Generation: ...


def request_id_for(episode_id: str, turn: int) -> str:
    """The request id of turn ``turn`` of an episode."""
    return f"{episode_id}{_REQUEST_SEPARATOR}{turn}"


def episode_of(request_id: str) -> str:
    """The episode id inside a request id (the sticky-session key)."""
    return request_id.rsplit(_REQUEST_SEPARATOR, 1)[0]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts (policy seed, request id, ...): stable across processes and runs,
    unlike ``hash()``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@functools.lru_cache(maxsize=8)
def closing_brace_ids(tokenizer: Any) -> tuple[int, ...]:
    """Every token id whose text holds a ``}``: the tokens that can close a ``\\boxed{...}`` move, where a row (or
    ``gem-core train``) asks each response to stop at its move (``stop_after_box``). Computed once per tokenizer
    (a pass over the whole vocabulary)."""
    ids = range(len(tokenizer))
    return tuple(i for i, token in zip(ids, tokenizer.convert_ids_to_tokens(list(ids))) if isinstance(token, str) and "}" in token)


def merge_stop_ids(params: SamplingParams, stop_ids: Sequence[int]) -> SamplingParams:
    """``params`` with ``stop_ids`` added to its stop tokens (order kept, no duplicates)."""
    merged = tuple(dict.fromkeys([*params.stop_token_ids, *stop_ids]))
    return params if merged == params.stop_token_ids else params.replace(stop_token_ids=merged)


async def resolve_in_thread(futures: Sequence[asyncio.Future], work: Callable[[], Sequence[Any]]) -> None:
    """Run ``work`` (one batched generation) in a thread and hand its i-th result to ``futures[i]`` (a result
    that is a :class:`ContextLimitExceeded`, :func:`answer_each`'s refusal of that request alone, is raised
    in its own episode); when ``work`` raises, every waiting future gets the exception (an ``Exception`` is
    not raised further here, so the caller's serving loop goes on with the next batch). Futures already
    done (cancelled episodes) are skipped."""
    try:
        results = await asyncio.to_thread(work)
    except BaseException as exc:
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return
    for future, result in zip(futures, results):
        if not future.done():
            if isinstance(result, ContextLimitExceeded):
                future.set_exception(result)
            else:
                future.set_result(result)
