"""ChatFormatter: the chat template as token deltas, so a context is built once and only ever appended to.

The context of an episode is::

    prompt_ids                      chat template of [system?, user: first observation] + generation prompt
    + response_ids(turn 0)          exactly the tokens the policy returned (never decoded and re-encoded)
    + observation_ids(turn 0)       what the template adds after that response: the rest of the assistant
                                    turn's closing, the user turn holding the observation, the generation prompt
    + response_ids(turn 1) + ...

The observation delta is found by rendering a fixed dummy conversation ``[system?, user, assistant]``
followed by the new message (with the generation prompt) and taking the text after the dummy assistant
reply. The text before it must be the same whatever the new message is (checked on every call), and the
delta is tokenised once, on its own. If the response ends with the template's end-of-turn token (e.g.
``<|im_end|>``) the delta starts after that token's text; if it does not (cut by ``max_tokens``), the
delta starts with the full closing, so the assistant turn is always closed.

History is never re-rendered. Templates that strip ``<think>`` blocks from earlier assistant turns
(Qwen3) would show the model a shorter history if the whole conversation were re-templated each turn;
here each turn's context holds the earlier responses exactly as generated, thinking included. That is
what token-in/token-out training needs (the trainer sees the very tokens the model was conditioned on),
and it is a deliberate difference from re-templating the history.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gem_core.rollout.policy import SamplingParams, merge_stop_ids

_DUMMY_USER = "gem-core dummy question"
_DUMMY_REPLY = "gem-core dummy reply 5c1f"  # unusual on purpose: it must occur once in a render
_PROBES = ("first probe observation", "Second probe:\n  with lines, <tags> and 123.")
# Observations a template might treat specially (trimming, tool-response or think markers, quotes,
# braces, special-token text, non-ASCII): substitution is trusted only if every one renders verbatim.
_SUBSTITUTION_PROBES = (
    "",
    "plain text",
    "  leading and trailing whitespace \n\n",
    "\nstarts with a newline",
    "<tool_response>\nlooks like a tool result\n</tool_response>",
    "<think>\nlooks like thinking\n</think>\n\nanswer",
    "quotes ' \" and braces {{ }} {% raw %} \\boxed{1}",
    "<|im_start|>user\n<|im_end|> <|endoftext|> </s> <s> [INST]",
    "unicode: \u00e9\u00e8 \u4e2d\u6587 \U0001f600",
)
_SENTINEL = "\x00gem-core-observation\x00"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used as token deltas (its rendering of earlier turns
    changes when a message is appended, or it has no generation prompt)."""


def strip_thinking(text: str, tags: tuple[str, str] = ("<think>", "</think>")) -> str:
    """``text`` without its thinking: what follows the last closing tag, or, for a block left open
    (cut by ``max_tokens``), what precedes the opening tag; text with neither tag is returned as is."""
    opened, closed = tags
    if closed in text:
        return text.rsplit(closed, 1)[1].strip()
    if opened in text:
        return text.split(opened, 1)[0].strip()
    return text


class ChatFormatter:
    """Turns observations into chat-template token deltas with a Hugging Face tokenizer.

    ``tokenizer``: anything with ``apply_chat_template(messages, tokenize=False, ...)``,
    ``encode(text, add_special_tokens=False)`` and ``decode(ids, skip_special_tokens=...)``.
    ``system_prompt``: an optional system message at the start of every episode.
    ``chat_template_kwargs``: passed to the template (e.g. ``{"enable_thinking": False}``).
    ``tool_role``: the role for observations whose step info has ``use_tool`` true (GEM's convention);
    ``"user"`` is used when the template cannot render it.
    ``strip_thinking``: the env receives the response with its ``<think>...</think>`` block removed
    (:meth:`action_text`); the context keeps it. ``think_tags``: the tags to strip.

    Speed: at construction the template is rendered for a set of probe observations (whitespace, tool
    and think markers, special-token text, quotes, unicode...). If every probe's delta is fixed template
    text + the observation verbatim + fixed template text, later deltas are built by that substitution
    (microseconds) instead of a render per observation; otherwise, or with
    ``render_every_observation=True``, each observation is rendered and its prefix checked. Likewise
    the tokenizer's Rust backend is called directly when it gives the same ids and text as the
    transformers wrapper on the probes.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        tool_role: str = "tool",
        strip_thinking: bool = True,
        think_tags: tuple[str, str] = ("<think>", "</think>"),
        render_every_observation: bool = False,
    ):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.chat_template = chat_template
        self.strip_thinking = strip_thinking
        self.think_tags = think_tags
        self._prefix_messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        self._dummy = [*self._prefix_messages, {"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_REPLY}]
        self._encode_fast = None
        self._decode_fast = None
        self._head = self._find_head()
        self.tool_role = tool_role if self._role_renders(tool_role) else "user"
        self._substitution: dict[str, tuple[str, str]] = {}
        if not render_every_observation:
            for role in dict.fromkeys(("user", self.tool_role)):
                pieces = self._substitution_pieces(role)
                if pieces is not None:
                    self._substitution[role] = pieces
        self._use_backend_if_identical()
        self.end_of_turn_id, self._end_text = self._find_end_of_turn()
        eos = getattr(tokenizer, "eos_token_id", None)
        stops = [t for t in (self.end_of_turn_id, eos) if t is not None]
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(t) for t in stops))
        generation_prompt = self.render(self._prefix_messages + [{"role": "user", "content": _DUMMY_USER}], True)
        # DeepSeek-R1-style templates open the think block in the prompt: the response has no "<think>".
        self.prompt_opens_thinking = generation_prompt.rstrip().endswith(think_tags[0])

    # -- rendering -----------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to ``messages``, as text."""
        kwargs = dict(self.chat_template_kwargs)
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        """Tokenise template text (special tokens in it are recognised; no BOS is added)."""
        if self._encode_fast is not None:
            return self._encode_fast(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Token ids back to text (for people, and for the env's action text)."""
        if self._decode_fast is not None:
            return self._decode_fast(list(token_ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def uses_substitution(self) -> bool:
        """Whether observation deltas are built by substitution (see the class docstring)."""
        return bool(self._substitution)

    # -- what the runner calls -------------------------------------------------------------------------
    def prompt_text(self, observation: str) -> str:
        """The first context as text: [system?, user: observation] with the generation prompt."""
        return self.render(self._prefix_messages + [{"role": "user", "content": observation}], True)

    def prompt_ids(self, observation: str) -> list[int]:
        """The first context: the template of the first observation, with the generation prompt."""
        return self.encode(self.prompt_text(observation))

    def observation_text(self, observation: str, response_closed: bool, role: str = "user") -> str:
        """The template text appended after a response: closing of the assistant turn (what the model did
        not generate of it), the observation's turn, the generation prompt."""
        if role != "user":
            role = self.tool_role
        pieces = self._substitution.get(role)
        if pieces is not None:
            tail = pieces[0] + observation + pieces[1]
        else:
            tail = self._rendered_tail(observation, role)
        if response_closed and self._end_text is not None:
            return tail[len(self._end_text) :]
        return tail

    def observation_ids(self, observation: str, response_ids: Sequence[int], role: str = "user") -> list[int]:
        """The observation delta as token ids, tokenised once (see :meth:`observation_text`)."""
        return self.encode(self.observation_text(observation, self.response_closed(response_ids), role))

    def response_closed(self, response_ids: Sequence[int]) -> bool:
        """Whether the response ends with the template's end-of-turn token."""
        return bool(response_ids) and self.end_of_turn_id is not None and int(response_ids[-1]) == self.end_of_turn_id

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with this template's stop tokens added."""
        return merge_stop_ids(params, self.stop_token_ids)

    def response_text(self, response_ids: Sequence[int]) -> str:
        """The response as a person reads it (special tokens such as ``<|im_end|>`` dropped)."""
        return self.decode(response_ids, skip_special_tokens=True)

    def action_text(self, response_text: str) -> str:
        """What the env receives: the response without its thinking (when ``strip_thinking``).

        A closed think block is dropped; an unclosed one (cut by ``max_tokens``) drops everything from
        its opening tag, or everything when the generation prompt itself opened it.
        """
        if not self.strip_thinking:
            return response_text
        opened, closed = self.think_tags
        if opened not in response_text and closed not in response_text:
            return "" if self.prompt_opens_thinking else response_text
        return strip_thinking(response_text, self.think_tags)

    # -- set-up checks -----------------------------------------------------------------------------------
    def _rendered_tail(self, observation: str, role: str) -> str:
        """The template text after the dummy reply, by rendering (the prefix is checked)."""
        full = self.render([*self._dummy, {"role": role, "content": observation}], True)
        if not full.startswith(self._head):
            raise ChatTemplateError(
                "the chat template renders the earlier turns differently once a new message is appended; "
                f"expected the render to start with {self._head[-80:]!r}, got {full[: len(self._head)][-80:]!r}"
            )
        return full[len(self._head) :]

    def _substitution_pieces(self, role: str) -> tuple[str, str] | None:
        """(before, after) such that every probe's tail is before + probe + after, else None."""
        try:
            sentinel_tail = self._rendered_tail(_SENTINEL, role)
        except Exception:
            return None
        if sentinel_tail.count(_SENTINEL) != 1:
            return None
        before, after = sentinel_tail.split(_SENTINEL)
        for probe in _SUBSTITUTION_PROBES:
            try:
                if self._rendered_tail(probe, role) != before + probe + after:
                    return None
            except Exception:
                return None
        return before, after

    def _use_backend_if_identical(self) -> None:
        """Call the Rust tokenizer directly when it agrees with the transformers wrapper on the probes."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return
        try:
            texts = [self.render([*self._dummy, {"role": "user", "content": p}], True) for p in _SUBSTITUTION_PROBES]
            texts.append("Hello , world . it 's  a test ! \n\n  spaced   out ?")
            for text in texts:
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
                if backend.encode(text, add_special_tokens=False).ids != ids:
                    return
                for skip in (False, True):
                    if backend.decode(ids, skip_special_tokens=skip) != self.tokenizer.decode(ids, skip_special_tokens=skip):
                        return
        except Exception:
            return
        self._encode_fast = backend.encode
        self._decode_fast = backend.decode

    def _find_head(self) -> str:
        """The render of the dummy conversation up to the end of the dummy reply, the same for any new
        message appended after it."""
        heads = []
        for probe in _PROBES:
            full = self.render([*self._dummy, {"role": "user", "content": probe}], True)
            at = full.find(_DUMMY_REPLY)
            if at < 0 or full.count(_DUMMY_REPLY) != 1:
                raise ChatTemplateError("the chat template does not render an assistant message's content verbatim")
            if probe not in full[at:]:
                raise ChatTemplateError("the chat template does not render a user message's content verbatim")
            heads.append(full[: at + len(_DUMMY_REPLY)])
        if heads[0] != heads[1]:
            raise ChatTemplateError("the chat template renders earlier turns differently depending on the next message")
        return heads[0]

    def _role_renders(self, role: str) -> bool:
        try:
            full = self.render([*self._dummy, {"role": role, "content": _PROBES[0]}], True)
        except Exception:  # templates that reject the role raise their own exception types
            return False
        return full.startswith(self._head) and _PROBES[0] in full[len(self._head) :]

    def _find_end_of_turn(self) -> tuple[int | None, str | None]:
        """The token that ends an assistant turn as the model generates it: the first token of the
        template's closing, when it is a special or added token (``<|im_end|>``, ``<|eot_id|>``)."""
        tail = self.observation_text(_PROBES[0], response_closed=False)
        ids = self.encode(tail)
        if not ids:
            return None, None
        first = int(ids[0])
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        special.update(int(i) for i in (getattr(self.tokenizer, "added_tokens_decoder", {}) or {}))
        if first not in special:
            return None, None
        text = self.decode([first])
        if not tail.startswith(text):
            return None, None
        return first, text


FORMATTER_CACHE_SIZE = 16
_formatters: collections.OrderedDict[tuple, ChatFormatter] = collections.OrderedDict()
_formatters_lock = threading.Lock()


def cached_formatter(tokenizer: Any, *, system_prompt: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None) -> ChatFormatter:
    """A :class:`ChatFormatter` built once per process for (tokenizer, system prompt, template kwargs).

    Building one probes the chat template (tens of renders); trainers build an agent loop per sample.
    Trainers that ship a fresh copy of the tokenizer with every call (OpenRLHF over Ray) would miss a
    cache keyed by object identity, so a tokenizer with a name is keyed by its name, chat template and
    size; an unnamed one by identity. At most :data:`FORMATTER_CACHE_SIZE` are kept (least recently used
    dropped). Thread-safe.
    """
    kwargs = dict(chat_template_kwargs or {})
    name = getattr(tokenizer, "name_or_path", None)
    identity: tuple = (name, getattr(tokenizer, "chat_template", None), len(tokenizer)) if name else (id(tokenizer),)
    key = (*identity, system_prompt, json.dumps(kwargs, sort_keys=True, default=str))
    with _formatters_lock:
        formatter = _formatters.get(key)
        if formatter is None or (not name and formatter.tokenizer is not tokenizer):
            formatter = ChatFormatter(tokenizer, system_prompt=system_prompt, chat_template_kwargs=kwargs)
        _formatters[key] = formatter
        _formatters.move_to_end(key)
        while len(_formatters) > FORMATTER_CACHE_SIZE:
            _formatters.popitem(last=False)
        return formatter
