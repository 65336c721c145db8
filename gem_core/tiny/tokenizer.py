"""A small byte-level BPE tokenizer with a chat template, built in code: nothing is downloaded.

Every test and every trainer plugin's test suite (each in its own virtualenv) builds the same tokenizer
from this module, so the golden scenario's token ids are identical everywhere. The vocabulary is the
256 byte symbols (any text round-trips exactly), a fixed list of whole-word merges (so tokens are
multi-character, as with a real tokenizer) and ChatML's special tokens. No training is involved: the
merges are written out below, so the ids do not depend on the ``tokenizers`` version.

Two chat templates:

* ``"qwen3"`` (default) behaves like Qwen3's: ``<|im_start|>role\\n...<|im_end|>\\n`` turns, ``<think>``
  blocks removed from assistant turns before the last user message, an empty ``<think>\\n\\n</think>\\n\\n``
  added to the final assistant turn and, with ``enable_thinking=False``, to the generation prompt. The
  final assistant turn therefore renders differently from the same turn further back in the history,
  which is exactly what breaks naive "render and take the suffix" delta code.
* ``"chatml"`` is plain ChatML (Qwen2.5-like, no default system prompt).
"""

from __future__ import annotations

import functools
import os
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE, "<tool_response>", "</tool_response>")

# The text the merges are learnt from. It is part of the tokenizer's definition: changing one character
# can change every golden token id, so leave it alone (add a new corpus under a new name instead).
_CORPUS = """
You are playing Guess The Number. Guess the number between 1 and 100 (inclusive) within 10 turns.
After each guess you are told whether the target is higher or lower. Only the number inside the box
counts as your guess, for example the first guess. Enter your first guess to start the game.
At turn 3, you guessed 50, and the target number is higher than 50. Enter your next guess.
At turn 4, you guessed 75, and the target number is lower than 75. Congratulations! You guessed the
correct number in 5 turns. You have reached the maximum number of turns.
You are playing Mastermind. A secret code of 4 digits is hidden. Each digit is between 1 and 6
(inclusive), and the digits of the code are all different. Crack it within 20 turns. Every guess is
scored with pegs: a black peg for each digit that is right and in the right position, and a white peg
for each further digit of the code that your guess contains in a different position. Write your guess
as 4 digits separated by spaces inside the box. Guessing the same code twice wastes a turn. Your
guesses and their pegs will be listed as you play; use them to narrow down the code.
At turn 2, you guessed 1 2 3 4: 2 black peg(s) and 1 white peg(s). The secret code was 1 2 3 4.
I will guess the middle of the range. The candidates that remain are consistent with the feedback.
Let me think about it. My answer is the number of codes that remain. The tool returned an output.
Use the python tool: print the result of the call and return the value. Your move was invalid.
The quick brown fox jumps over the lazy dog. Hello world! What is the answer? Please think step by step.
system user assistant tool \\boxed{5} \\boxed{1 2 3 4} \\boxed{12} user assistant boxed boxed
"""
_NUM_MERGES = 400


def _learn_merges(num_merges: int = _NUM_MERGES) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Plain BPE on :data:`_CORPUS`, in pure Python with explicit tie-breaks (most frequent pair, then
    the smallest pair in string order), so every machine and library version learns the same merges."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {symbol: i for i, symbol in enumerate(alphabet)}
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    word_counts: dict[str, int] = {}
    for word, _ in splitter.pre_tokenize_str(_CORPUS):
        word_counts[word] = word_counts.get(word, 0) + 1
    words = [(list(word), count) for word, count in sorted(word_counts.items())]
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pair_counts: dict[tuple[str, str], int] = {}
        for symbols, count in words:
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] = pair_counts.get(pair, 0) + count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merged = best[0] + best[1]
        merges.append(best)
        vocab.setdefault(merged, len(vocab))
        for symbols, _ in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    symbols[i : i + 2] = [merged]
                i += 1
    return vocab, merges


QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set content = m['content'] -%}"
    "{%- if loop.index0 < ns.last_query and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- elif loop.last and loop.index0 > ns.last_query and '</think>' not in content -%}"
    "{%- set content = '<think>\\n\\n</think>\\n\\n' + content -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

CHAT_TEMPLATES = {"qwen3": QWEN3_TEMPLATE, "chatml": CHATML_TEMPLATE}


def build_raw_tokenizer() -> Any:
    """The ``tokenizers.Tokenizer`` (no transformers needed): byte-level BPE plus the special tokens."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_raw_tokenizer_json())


@functools.lru_cache(maxsize=1)
def _raw_tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = _learn_merges()
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer.to_str()


def build_test_tokenizer(chat_template: str = "qwen3") -> Any:
    """A transformers fast tokenizer (eos ``<|im_end|>``, pad ``<|endoftext|>``) with a chat template.

    ``chat_template``: ``"qwen3"`` (default), ``"chatml"``, or a Jinja template string of your own.
    """
    from transformers import PreTrainedTokenizerFast

    template = CHAT_TEMPLATES.get(chat_template, chat_template)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_raw_tokenizer(),
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = template
    return tokenizer


def save_test_tokenizer(directory: str | os.PathLike[str], chat_template: str = "qwen3") -> str:
    """Save :func:`build_test_tokenizer` with ``save_pretrained`` (for trainers that load a tokenizer by
    path) and return the directory."""
    directory = os.fspath(directory)
    build_test_tokenizer(chat_template).save_pretrained(directory)
    return directory
