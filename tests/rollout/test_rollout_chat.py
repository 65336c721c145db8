"""ChatFormatter: chat-template token deltas, closing of cut responses, thinking, tool turns."""

from __future__ import annotations

import asyncio

import pytest
from rollout_envs import ScriptedRewardEnv

from gem_core.rollout import ChatFormatter, ChatTemplateError, SamplingParams, ScriptedPolicy, run_episode
from gem_core.testing import build_test_tokenizer


def _messages(trajectory, upto_turn: int) -> list[dict[str, str]]:
    """The conversation a person reads at the start of turn ``upto_turn``."""
    messages = [{"role": "user", "content": trajectory.initial_observation}]
    for turn in trajectory.turns[:upto_turn]:
        messages.append({"role": "assistant", "content": turn.response_text})
        messages.append({"role": "user", "content": turn.observation})
    return messages


def test_prompt_is_the_chat_template_of_the_first_observation(tokenizer, formatter):
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False, add_generation_prompt=True)
    assert formatter.prompt_text("Hello there") == expected
    assert formatter.decode(formatter.prompt_ids("Hello there")) == expected


def test_delta_after_a_closed_response_starts_after_the_end_token(tokenizer, formatter):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert formatter.end_of_turn_id == im_end
    assert formatter.stop_token_ids == (im_end,)
    closed = formatter.decode(formatter.observation_ids("obs", [5, im_end]))
    cut = formatter.decode(formatter.observation_ids("obs", [5, 6]))
    assert closed == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    assert cut == "<|im_end|>" + closed  # a response cut by max_tokens gets its turn closed


@pytest.mark.parametrize("template", ["qwen3", "chatml"])
def test_decoded_context_equals_what_a_person_reads(template):
    """At every turn, the token context decodes to the chat template of the conversation so far."""
    tokenizer = build_test_tokenizer(template)
    formatter = ChatFormatter(tokenizer)
    replies = iter(["I pick \\boxed{3}.", "Then \\boxed{4}!", "Last one: \\boxed{5}"])
    policy = ScriptedPolicy(tokenizer, lambda context: next(replies))
    env = ScriptedRewardEnv([0.0, 0.5, 1.0])
    trajectory = asyncio.run(run_episode(env, policy, formatter, seed=7, episode_id="readable"))
    assert trajectory.num_turns == 3 and trajectory.terminated
    for t in range(trajectory.num_turns):
        rendered = tokenizer.apply_chat_template(_messages(trajectory, t), tokenize=False, add_generation_prompt=True)
        assert formatter.decode(trajectory.context_ids(t)) == rendered
    assert [turn.action for turn in trajectory.turns] == ["I pick \\boxed{3}.", "Then \\boxed{4}!", "Last one: \\boxed{5}"]
    assert env.actions == [turn.action for turn in trajectory.turns]


def test_model_tokens_are_never_re_encoded(tokenizer, formatter):
    """A response whose ids are not the canonical encoding of its text survives verbatim in the context."""
    canonical = tokenizer.encode(" the", add_special_tokens=False)
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in ["\u0120", "t", "h", "e"]]  # same text, other ids
    assert canonical != spelled and tokenizer.decode(spelled) == tokenizer.decode(canonical)
    im_end = formatter.end_of_turn_id

    class Fixed:
        async def generate(self, prompt_ids, params, *, request_id=""):
            from gem_core.rollout import Generation

            return Generation(spelled + [im_end], [-0.5] * 5, "stop")

    trajectory = asyncio.run(run_episode(ScriptedRewardEnv([0.0, 1.0]), Fixed(), formatter, seed=0))
    ids = trajectory.full_ids()
    start = len(trajectory.prompt_ids)
    assert ids[start : start + 5] == spelled + [im_end]
    assert trajectory.turns[1].response_ids == spelled + [im_end]


def test_each_observation_is_tokenised_once(tokenizer):
    """Tokeniser work per turn is the observation delta only: one encode call, never the history."""

    class Counting:
        backend_tokenizer = None  # count through encode(): no direct calls to the Rust backend

        def __init__(self, inner):
            self.inner, self.encoded = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def encode(self, text, **kwargs):
            self.encoded.append(text)
            return self.inner.encode(text, **kwargs)

    counting = Counting(tokenizer)
    formatter = ChatFormatter(counting)
    counting.encoded.clear()
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")  # its own tokenizer: not counted
    env = ScriptedRewardEnv([0.0] * 5 + [1.0], obs_chars=50)
    trajectory = asyncio.run(run_episode(env, policy, formatter, seed=0))
    assert trajectory.num_turns == 6
    assert len(counting.encoded) == 1 + 5  # the prompt, then one delta per observation shown
    assert all(len(text) < 200 for text in counting.encoded[1:])  # deltas, not the growing history


def test_qwen3_style_template_defeats_naive_suffix_but_not_the_formatter(tokenizer, formatter):
    """The final assistant turn renders with an empty think block, earlier ones without: naive
    'render with and without the new message' deltas break; the formatter's do not."""
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    without = tokenizer.apply_chat_template(base, tokenize=False)
    with_new = tokenizer.apply_chat_template(base + [{"role": "user", "content": "o"}], tokenize=False, add_generation_prompt=True)
    assert not with_new.startswith(without)
    assert formatter.observation_text("o", response_closed=True) == "\n<|im_start|>user\no<|im_end|>\n<|im_start|>assistant\n"


def test_enable_thinking_false_puts_the_empty_think_block_in_every_generation_prompt(tokenizer):
    formatter = ChatFormatter(tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert formatter.prompt_text("hi").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert formatter.observation_text("obs", True).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_thinking_is_kept_in_context_and_removed_from_the_action(tokenizer, formatter):
    """History is not re-rendered, so earlier thinking stays in the context (the Qwen3 template would
    drop it on a re-render); the env only sees the answer."""
    policy = ScriptedPolicy(tokenizer, lambda context: "<think>\nhmm, 3 or 4?\n</think>\n\n\\boxed{3}")
    env = ScriptedRewardEnv([0.0, 1.0])
    trajectory = asyncio.run(run_episode(env, policy, formatter, seed=0))
    assert env.actions == ["\\boxed{3}", "\\boxed{3}"]
    context = formatter.decode(trajectory.context_ids(1))
    assert "hmm, 3 or 4?" in context
    rerendered = tokenizer.apply_chat_template(_messages(trajectory, 1), tokenize=False, add_generation_prompt=True)
    assert "hmm, 3 or 4?" not in rerendered  # what re-templating the history would have lost


def test_action_text_handles_unclosed_and_prompt_opened_thinking(tokenizer, formatter):
    assert formatter.action_text("<think>long thoughts cut") == ""
    assert formatter.action_text("answer first <think>then") == "answer first"
    assert formatter.action_text("\\boxed{1}") == "\\boxed{1}"
    r1_style = "{{- bos }}{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif -%}"
    opened = ChatFormatter(tokenizer, chat_template=r1_style.replace("{{- bos }}", ""))
    assert opened.prompt_opens_thinking
    assert opened.action_text("still thinking, no close tag") == ""
    assert opened.action_text("thought</think>\n\\boxed{2}") == "\\boxed{2}"
    keep = ChatFormatter(tokenizer, strip_thinking=False)
    assert keep.action_text("<think>x</think>y") == "<think>x</think>y"


def test_tool_observations_use_the_tool_turn(tokenizer, formatter):
    assert formatter.tool_role == "tool"
    text = formatter.observation_text("42", response_closed=True, role="tool")
    assert "<tool_response>\n42\n</tool_response>" in text
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    trajectory = asyncio.run(run_episode(ScriptedRewardEnv([0.0, 1.0], use_tool=True), policy, formatter, seed=0))
    assert "<tool_response>" in formatter.decode(trajectory.turns[0].obs_delta_ids)


def test_system_prompt_is_in_the_prompt_only(chatml_tokenizer):
    formatter = ChatFormatter(chatml_tokenizer, system_prompt="Be brief.")
    assert formatter.prompt_text("hi").startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi")
    assert "system" not in formatter.observation_text("obs", True)


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    """A template whose rendering of earlier turns depends on the new message cannot give deltas."""
    hostile = (
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{%- if m['role'] == 'assistant' -%}{{ '(' ~ messages[-1]['content'] | length ~ ') ' }}{%- endif -%}"
        "{{ m['content'] + '<|im_end|>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )
    with pytest.raises(ChatTemplateError, match="differently"):
        ChatFormatter(tokenizer, chat_template=hostile)


def test_sampling_params_get_the_stop_token(formatter):
    params = formatter.sampling_params(SamplingParams(max_tokens=8, stop_token_ids=(3,)))
    assert params.stop_token_ids == (3, formatter.end_of_turn_id)
    assert formatter.sampling_params(params) is params  # already there: unchanged


class _WrapperOnly:
    """The tokenizer without its Rust backend attribute: the formatter must use encode/decode."""

    backend_tokenizer = None

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("kwargs", [{}, {"chat_template_kwargs": {"enable_thinking": False}}, {"system_prompt": "Be brief."}])
def test_fast_paths_equal_the_exact_path(tokenizer, kwargs):
    """Substitution and the Rust backend give exactly the ids of rendering every observation through
    the transformers wrapper."""
    fast = ChatFormatter(tokenizer, **kwargs)
    exact = ChatFormatter(_WrapperOnly(tokenizer), render_every_observation=True, **kwargs)
    assert fast.uses_substitution and fast._encode_fast is not None
    assert not exact.uses_substitution and exact._encode_fast is None
    observations = ["", " x ", "line\n\nline", "<tool_response>\n1\n</tool_response>", "{{ '%}' }} \\boxed{2}", "\u00e9\u4e2d"]
    for observation in observations:
        for closed in ([5, fast.end_of_turn_id], [5, 6]):
            for role in ("user", "tool"):
                assert fast.observation_ids(observation, closed, role) == exact.observation_ids(observation, closed, role)
        assert fast.prompt_ids(observation) == exact.prompt_ids(observation)
        ids = fast.prompt_ids(observation)
        assert fast.decode(ids) == exact.decode(ids) and fast.response_text(ids) == exact.response_text(ids)


def test_templates_that_touch_content_are_rendered_every_time(tokenizer):
    """A template that trims observations cannot use substitution; it still gives correct deltas."""
    trimming = (
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] | trim) + '<|im_end|>\\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )
    formatter = ChatFormatter(tokenizer, chat_template=trimming)
    assert not formatter.uses_substitution
    assert formatter.observation_text("  padded  ", True) == "\n<|im_start|>user\npadded<|im_end|>\n<|im_start|>assistant\n"


def test_cached_formatter_builds_once_per_tokenizer_and_prompt():
    from gem_core.rollout import cached_formatter

    tokenizer = build_test_tokenizer("qwen3")
    first = cached_formatter(tokenizer, system_prompt="s")
    assert cached_formatter(tokenizer, system_prompt="s") is first
    assert cached_formatter(tokenizer, system_prompt="t") is not first
    assert cached_formatter(tokenizer, system_prompt="s", chat_template_kwargs={"enable_thinking": False}) is not first
    import copy

    named = copy.deepcopy(tokenizer)
    named.name_or_path = "local/test-tokenizer"
    again = copy.deepcopy(named)  # a fresh copy per call, as OpenRLHF's Ray calls send it
    assert cached_formatter(named) is cached_formatter(again)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>plan</think> \\boxed{3}", "\\boxed{3}"),  # a closed block: what follows it
        ("<think>a</think>x<think>b</think> y ", "y"),  # several: what follows the last
        ("\\boxed{3} <think>cut by max_tokens", "\\boxed{3}"),  # left open: what precedes it
        ("no thinking here ", "no thinking here "),  # neither tag: unchanged
    ],
)
def test_strip_thinking(text, expected):
    from gem_core.rollout.chat import strip_thinking

    assert strip_thinking(text) == expected
    assert strip_thinking(text.replace("<think>", "[t]").replace("</think>", "[/t]"), ("[t]", "[/t]")) == expected
