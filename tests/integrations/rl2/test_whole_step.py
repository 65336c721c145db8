"""The README's RL2 commands through RL2's whole training step on CPU, as ``torchrun`` runs them: the
README's ``gem-core make-dataset rl2`` lines, then ``python -m gem_integrations.rl2.train`` with the
README's overrides in each rank process (``rank_main.py``: its stand-ins are named there), through
rl-square 0.0.2's hydra ``main``, ``PPOTrainer.__init__`` and one ``train()`` step: the rollout with the
env module, the ReBN advantage step, ``Actor.update`` (RL2's minibatch balancing and padding, its loss,
backward and optimizer step), ``Rollout.update`` (the weight sync) and ``save_model``.

Replaced in the README's command, and why: ``actor.model_name`` (a tiny local model: nothing is
downloaded), ``--n`` and ``train_data.prompts_per_rollout`` (3 rows, one batch: a CPU-sized step),
``actor.max_length_per_device`` (just above the longest sequence, so that with 2 data-parallel ranks
RL2 needs 3 minibatches, rounds them up to 4 and pads one empty sequence), ``--nproc_per_node`` (2).
The same run with one rank (no padding) must give the same loss, gradient norm and weights."""

from __future__ import annotations

import base64
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

import readme_command  # noqa: E402  (this folder is on the path)
from rank_runner import run_ranks  # noqa: E402
from sglang_server import FakeSGLang  # noqa: E402
from gem_core.rollout import SamplingParams
from gem_core.testing.golden import GoldenEpisode, golden_scenario
from gem_integrations.rl2 import metrics as gem_metrics
from gem_integrations.rl2 import rollout as gem_rollout
from gem_integrations.rl2 import train

HERE = Path(__file__).resolve().parent
ROWS = 3


def _synced_weights(server: FakeSGLang) -> dict[str, torch.Tensor]:
    """The weights RL2's ``Rollout.update`` sent to the SGLang stand-in (``update_weights_from_tensor``)."""
    weights = {}
    for path, body in server.calls:
        if path.rstrip("/").endswith("update_weights_from_tensor"):
            for blob in body["serialized_named_tensors"]:
                for name, local in pickle.loads(base64.b64decode(blob)):
                    weights[name] = pickle.loads(local["values"][0])
    return weights


def _logged(record: dict, key: str) -> list[float]:
    return [data[key] for data, _ in record["wandb"] if key in data]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny random Qwen2 model and the test tokenizer, saved where the README's model name goes."""
    from gem_core.testing import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer), seed=0, hidden_size=32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.slow
def test_readme_command_through_rl2_whole_step_on_two_ranks(tokenizer, model_dir, tmp_path):
    from gem_core.cli import main as gem_core_main

    os.chdir(tmp_path)  # the README's relative paths (train.jsonl, test.jsonl, ckpts/)
    try:
        for out in readme_command.dataset_outputs():
            assert gem_core_main(readme_command.make_dataset_args(out=out, n=str(ROWS if out == "train.jsonl" else 2))) == 0
    finally:
        os.chdir(HERE)
    with open(tmp_path / "train.jsonl") as handle:
        specs = [gem_rollout.task_spec(json.loads(line)) for line in handle]
    given = train.given(readme_command.launcher_args())
    max_tokens = int(given["rollout.train_sampling_params.max_new_tokens"])
    reference = golden_scenario(
        tokenizer=tokenizer, episodes=tuple(GoldenEpisode(s.env_id, s.seed, f"row{i}", f"row{i}", s.env_kwargs, s.tools) for i, s in enumerate(specs)),
        params=SamplingParams(max_tokens=max_tokens, temperature=1.0), max_context_tokens=1 << 20, gamma=float(given["adv.gamma"]),
    )  # fmt: skip
    lengths = [len(s.prompt_ids) + len(s.response_ids) - 1 for s in reference.sequences]  # RL2 drops the last token
    longest = max(lengths)
    assert sum(lengths) > 2 * longest, f"sequence lengths {lengths}: 3 minibatches of at most {longest} tokens are needed to force RL2's padding"
    assert readme_command.torchrun_processes() > 2
    args = readme_command.launcher_args(actor__model_name=model_dir, train_data__prompts_per_rollout=str(ROWS), actor__max_length_per_device=str(longest))

    runs = {}
    for world in (2, 1):
        server = FakeSGLang(tokenizer)
        try:
            runs[world] = (
                run_ranks(HERE / "rank_main.py", world, args, tmp_path, tmp_path / f"world{world}", server.url, timeout=480),
                _synced_weights(server),
                list(server.calls),
            )
        finally:
            server.close()

    two, one = runs[2][0], runs[1][0]
    # RL2's batch on rank 0: the reference's tokens, masks, rewards and ReBN advantages.
    batch = two[0]["batch"]
    for i, sequence in enumerate(reference.sequences):
        full = list(sequence.prompt_ids) + list(sequence.response_ids)
        (row,) = [r for r in range(batch["states"].shape[0]) if batch["states"][r, : len(full) - 1].tolist() == full[:-1]]
        n_prompt, n = len(sequence.prompt_ids), len(full) - 1
        assert batch["action_mask"][row, :n].tolist() == [0] * (n_prompt - 1) + list(sequence.loss_mask)
        assert batch["rewards"][row, :n].tolist() == pytest.approx([0.0] * (n_prompt - 1) + sequence.token_rewards(), abs=1e-6)
        assert batch["advantages"][row, :n].tolist() == pytest.approx([0.0] * (n_prompt - 1) + reference.token_advantages[i], abs=1e-6)
    assert max(t.num_turns for t in reference.trajectories) > 1
    for key in batch:
        assert torch.equal(batch[key], one[0]["batch"][key]), key

    # RL2's balancing: 3 sequences need 3 minibatches, rounded up to 4 for 2 ranks: one empty sequence
    # is padded in, and each rank updates on 2 minibatches; with one rank, 3 minibatches, no padding.
    assert two[0]["pad_sequences"] == [1]  # rank 0 packs and pads, then scatters
    assert [len(r["minibatches"][0][0]) for r in two] == [2, 2]
    assert sum(sum(r["minibatches"][0][0]) for r in two) == ROWS + 1
    assert one[0]["pad_sequences"] == [0] and len(one[0]["minibatches"][0][0]) == ROWS
    actions = int(batch["action_mask"].sum())
    assert sum(sum(r["minibatch_actions"][0][0]) for r in two) == actions == sum(one[0]["minibatch_actions"][0][0])

    # The loss, the gradient and the update are the same with and without RL2's padding.
    for key in ("actor/loss", "actor/grad_norm"):
        (a,), (b,) = _logged(two[0], key), _logged(one[0], key)
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), key
    (grad_norm,) = _logged(two[0], "actor/grad_norm")
    assert grad_norm > 0
    synced_two, synced_one = runs[2][1], runs[1][1]
    initial = _initial_state(model_dir)
    assert synced_two and set(synced_two) == set(synced_one) and set(synced_two) <= set(initial)
    moved = [k for k in synced_two if not torch.equal(synced_two[k].float(), initial[k].float())]
    assert moved, "the optimizer step changed no weight that RL2 synced to SGLang"
    for k in synced_two:  # an Adam step moves each weight by about actor.lr (1e-6): equal far below that
        assert torch.allclose(synced_two[k].float(), synced_one[k].float(), rtol=0, atol=1e-8), k

    # Metrics, and nothing left behind.
    for record in (two[0], one[0]):
        assert _logged(record, gem_metrics.INFRA_FAILED) == [0.0] and _logged(record, gem_metrics.ABANDONED) == [0.0]
        assert (record["pending"], record["envs_made"], record["envs_unclosed"], record["envs_closed_twice"]) == (0, ROWS, 0, 0)
    assert two[1]["envs_made"] == 0  # the rollout runs on rank 0 only
    assert (tmp_path / "ckpts" / given["trainer.experiment_name"] / "config.json").is_file()  # RL2's save_model
    assert any(path.endswith("release_memory_occupation") for path, _ in runs[2][2])


def _initial_state(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_sdpa_stand_in_keeps_packed_sequences_apart(tokenizer, model_dir):
    """RL2 packs a minibatch's sequences into one row (flash-attn varlen on GPU); the CPU stand-in (sdpa,
    sequences told apart by the position ids restarting at 0) must equal separate forwards."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    seqs = [torch.arange(5, 17), torch.arange(40, 47), torch.arange(100, 121)]
    packed = torch.cat(seqs).unsqueeze(0)
    positions = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)
    with torch.no_grad():
        together = model(input_ids=packed, position_ids=positions, use_cache=False).logits[0]
        apart = torch.cat([model(input_ids=s.unsqueeze(0), use_cache=False).logits[0] for s in seqs])
    assert torch.allclose(together, apart, atol=1e-5)
