"""The converted checkpoint of the embedded model: its tokenizer is the GGUF's, and its config names a class
that transformers 4.x loads too (the oat_real session loads it with transformers 4.51, vLLM 0.8.5's)."""

from __future__ import annotations

import json
from pathlib import Path

from gem_core.models import SMOLLM2, gguf_path

MESSAGES = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess a number: \\boxed{7}?"}, {"role": "assistant", "content": "\\boxed{3}"}]


def test_the_converted_tokenizer_is_the_ggufs_and_names_a_class_every_transformers_reads(model_dir):
    from transformers import AutoTokenizer

    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in config and "local_files_only" not in config
    converted = AutoTokenizer.from_pretrained(model_dir)
    gguf = gguf_path(SMOLLM2)
    original = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for add in (True, False):
        messages = MESSAGES[:2] if add else MESSAGES
        assert converted.apply_chat_template(messages, add_generation_prompt=add, tokenize=False) == original.apply_chat_template(
            messages, add_generation_prompt=add, tokenize=False
        )
    text = "At turn 2, you guessed 17, and the target number is lower than 17.<|im_end|>"
    assert converted(text)["input_ids"] == original(text)["input_ids"]
    assert (converted.eos_token_id, converted.pad_token_id, len(converted)) == (original.eos_token_id, original.pad_token_id, len(original))
