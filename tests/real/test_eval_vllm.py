"""`gem-core eval --policy vllm` on the real engine and model: the same greedy episodes as `--policy hf` with one
dtype named (`auto` differs by design: vLLM runs a float32 checkpoint in half precision)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

ARGS = [
    "game:GuessTheNumber-v0-random",
    "--episodes",
    "3",
    "--max-tokens",
    "32",
    "--temperature",
    "0",
    "--save-transcripts",
    "--no-progress",
    "--dtype",
    "float32",
]


def _episodes(path):
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "env_id" in row:
            out.append(row)
    return sorted(out, key=lambda r: r["seed"])


def test_eval_with_the_vllm_policy_plays_what_the_hf_policy_plays(model_dir, tmp_path, capsys):
    from gem_core.cli import main

    for policy in ("vllm", "hf"):
        out = tmp_path / f"{policy}.jsonl"
        assert main(["eval", *ARGS, "--policy", policy, "--model", model_dir, "--out", str(out)]) == 0
    vllm_rows, hf_rows = _episodes(tmp_path / "vllm.jsonl"), _episodes(tmp_path / "hf.jsonl")
    assert len(vllm_rows) == len(hf_rows) == 3 and all(r["error"] is None for r in vllm_rows)
    for v, h in zip(vllm_rows, hf_rows):
        assert v["transcript"] == h["transcript"]  # every turn's text, token for token greedy
        assert (v["return"], v["turns"], v["tokens_in"], v["tokens_out"], v["finish_reason"]) == (
            h["return"],
            h["turns"],
            h["tokens_in"],
            h["tokens_out"],
            h["finish_reason"],
        )
    assert sum(r["turns"] for r in vllm_rows) >= 3 and all(r["tokens_out"] > 0 for r in vllm_rows)
