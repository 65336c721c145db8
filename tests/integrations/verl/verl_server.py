"""A CPU stand-in for verl's vLLM rollout server, for the verl plugin tests.

:class:`FaithfulVerlServer` has the signature of ``vLLMHttpServer.generate`` (verl 0.9.1,
``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) and follows its rules, read from that code:

* ``max_tokens`` is popped from ``sampling_params`` (``max_new_tokens`` too); when absent it is
  ``min(response_length, prompt_length + response_length - len(prompt))``. Either way it is clamped to
  ``[1, max_model_len - len(prompt)]``: the server shortens a request that would overrun the context.
  A prompt that leaves no room is a ``ValueError``.
* ``logprobs`` (a bool from the agent loop) becomes vLLM's ``0``/``None``; ``repetition_penalty`` and
  ``ignore_eos`` get the server's defaults.
* The answer is a verl ``TokenOutput``: vLLM's token ids (the stop token included), the sampled
  token's logprob per token, and ``stop_reason`` ``"completed"`` for vLLM's ``stop`` *and* ``length``,
  ``"aborted"`` for ``abort``; ``extra_fields["global_steps"]``.

Infrastructure failures on demand (:meth:`FaithfulVerlServer.abort_prompts_containing`): the engine aborts
the requests whose prompt holds a marker, from a given call on, and the server answers as verl's does for
an aborted vLLM request (what was generated so far, ``stop_reason="aborted"``). verl's client sends each
turn under a fresh request id, so the prompt, not the id, names the episode.

Images: ``image_data`` (verl's list of PIL images) is handled as verl's vLLM server does: the prompt's
image-token runs cut only for a Qwen2-VL-family processor (verl's own ``qwen2_5_vl_dedup_image_tokens``),
then ``{"prompt_token_ids": ..., "multi_modal_data": {"image": image_data}}`` (with ``mm_processor_kwargs``
when given) to the engine, which expands each image token as vLLM does, with those processor kwargs. ``model``: a vision-language engine model
(:class:`~gem_core.testing.vllm_engine.HFVisionModel`) instead of the scripted text one.

Underneath is gem_core's :class:`~gem_core.testing.vllm_engine.VLLMFaithfulEngine` (vLLM's request
semantics) over the golden scenario's :class:`~gem_core.testing.vllm_engine.ScriptedModel`, a model that
keeps writing past its end-of-turn token unless a stop token stops it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


class FaithfulVerlServer:
    """verl's vLLM server ``generate`` over a vLLM-faithful engine (see the module docstring).

    ``tokenizer_path``: a local tokenizer directory (the actor loads it itself). ``prompt_length`` /
    ``response_length``: verl's rollout config; ``max_model_len`` defaults to their sum, as verl's.
    ``respond``: the scripted policy (decoded context -> response text); default the golden scenario's.
    """

    def __init__(
        self,
        tokenizer_path: str,
        *,
        prompt_length: int,
        response_length: int,
        max_model_len: int | None = None,
        global_steps: int = 1,
        respond: Callable[[str], str] | None = None,
        model: Any = None,
    ):
        from transformers import AutoTokenizer

        from gem_core.testing.golden import golden_respond
        from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.tokenizer = tokenizer
        self._abort_rules: list[list[Any]] = []  # [marker, first call to abort, calls seen]
        self.prompt_length = int(prompt_length)
        self.response_length = int(response_length)
        self.max_model_len = int(max_model_len or prompt_length + response_length)
        self.processor = getattr(model, "processor", None)
        model = model if model is not None else ScriptedModel(tokenizer, respond or golden_respond)
        self.engine = VLLMFaithfulEngine(model, max_model_len=self.max_model_len)
        self.global_steps = global_steps
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int = 0,
        kv_transfer_params: Any = None,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput
        from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

        sampling_params = dict(sampling_params)
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "sampling_params": dict(sampling_params),
                "image_data": image_data,
                "mm_processor_kwargs": mm_processor_kwargs,
            }
        )
        if video_data is not None or audio_data is not None:
            raise ValueError("this stand-in serves images only")
        max_possible_tokens = self.max_model_len - len(prompt_ids)
        if max_possible_tokens < 1:
            raise ValueError(f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the model's maximum context length ({self.max_model_len})")
        if "max_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_tokens")
        elif "max_new_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_new_tokens")
        else:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(max_tokens, max_possible_tokens))
        sampling_params["logprobs"] = 0 if sampling_params.pop("logprobs", False) else None
        sampling_params.setdefault("repetition_penalty", 1.0)
        sampling_params.setdefault("ignore_eos", False)
        sampling_params["max_tokens"] = max_tokens

        if self._aborts(prompt_ids):
            self.engine.aborted.add(request_id)
        if image_data is not None:  # verl's vLLM server: TokensPrompt(prompt_token_ids, multi_modal_data={"image": image_data})
            prompt_ids = qwen2_5_vl_dedup_image_tokens(list(prompt_ids), self.processor)
            final = await self.engine.generate(
                list(prompt_ids), sampling_params, multi_modal_data={"image": image_data}, request_id=request_id, mm_processor_kwargs=mm_processor_kwargs
            )
        else:
            final = await self.engine.generate_tokens(request_id, prompt_ids=list(prompt_ids), sampling_params=sampling_params)
        extra_fields = {"global_steps": self.global_steps}
        if not final.outputs:
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra_fields)
        output = final.outputs[0]
        token_ids = list(output.token_ids)
        log_probs = None
        if sampling_params["logprobs"] is not None:
            log_probs = [records[token_ids[i]].logprob for i, records in enumerate(output.logprobs)]
        if output.finish_reason == "abort":
            stop_reason = "aborted"
        elif output.finish_reason in ("stop", "length"):
            stop_reason = "completed"
        else:
            stop_reason = output.finish_reason
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason=stop_reason, num_preempted=None, extra_fields=extra_fields)

    def get_calls(self) -> list[dict[str, Any]]:
        return list(self.calls)

    def abort_prompts_containing(self, marker: str, from_call: int = 1) -> None:
        """Abort every request whose decoded prompt contains ``marker``, from the ``from_call``-th such
        request on (1: the first; 2: the episode's first turn is answered, its second aborted)."""
        self._abort_rules.append([marker, int(from_call), 0])

    def _aborts(self, prompt_ids: list[int]) -> bool:
        if not self._abort_rules:
            return False
        text = self.tokenizer.decode(list(prompt_ids))
        hit = False
        for rule in self._abort_rules:
            if rule[0] in text:
                rule[2] += 1
                hit = hit or rule[2] >= rule[1]
        return hit


class InProcessServerManager:
    """verl's ``LLMServerClient.generate`` call shape over one :class:`FaithfulVerlServer` in this process
    (for tests that drive an agent loop without Ray); the client's ``min/max_global_steps`` included."""

    def __init__(self, server: FaithfulVerlServer):
        self.server = server

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.server.calls

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        output = await self.server.generate(prompt_ids=prompt_ids, sampling_params=sampling_params, request_id=request_id, **kwargs)
        steps = output.extra_fields.get("global_steps")
        output.extra_fields.setdefault("min_global_steps", steps)
        output.extra_fields.setdefault("max_global_steps", steps)
        return output


_GRID_ROW = re.compile(r"^\s*(\d+) \| (.*) \|\s*$")
_MOVE = re.compile(r"\\boxed\{(\d+) (\d+) (\d+)\}")
_USER_OR_ASSISTANT = re.compile(r"<\|im_start\|>(user|assistant)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


def sudoku_respond(context: str) -> str:
    """A scripted Sudoku player (a pure function of the decoded context): in the last grid shown, the
    first empty cell and the smallest digit that clashes with nothing in its row, column and box, leaving
    out moves it already made that the env rejected (their cell is still empty). Some moves are accepted
    (reward 1/empty cells), some rejected (0), so episodes earn different per-turn rewards."""
    turns = _USER_OR_ASSISTANT.findall(context)
    grid_text = next((text for role, text in reversed(turns) if role == "user" and "| " in text), "")
    rows = [match.group(2) for match in map(_GRID_ROW.match, grid_text.splitlines()) if match]
    grid = [[0 if c == "." else int(c) for c in row.replace("|", " ").split()] for row in rows]
    if not grid:
        return "No grid here. \\boxed{1 1 1}"
    scale = len(grid)
    box = int(scale**0.5)
    tried = {tuple(map(int, m)) for role, text in turns if role == "assistant" for m in _MOVE.findall(text)}
    for r in range(scale):
        for c in range(scale):
            if grid[r][c]:
                continue
            top, left = r - r % box, c - c % box
            used = set(grid[r]) | {grid[i][c] for i in range(scale)}
            used |= {grid[i][j] for i in range(top, top + box) for j in range(left, left + box)}
            for digit in range(1, scale + 1):
                if digit not in used and (r + 1, c + 1, digit) not in tried:
                    return f"Row {r + 1}, column {c + 1}: {digit}. \\boxed{{{r + 1} {c + 1} {digit}}}"
    return "Nothing left to try. \\boxed{1 1 1}"
