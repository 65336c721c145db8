"""Two whole OpenRLHF training steps on CPU, from the example script's own arguments.

`examples/openrlhf/train_gtn_rebn.sh` runs in a fresh copy of the repository: its `make-dataset` really
writes the prompt file, and the exact `gem-core openrlhf train` arguments it builds (plus the CPU
adaptations a user appends to it, listed in CPU_ARGS) go to the launcher's `main` in this process, in the
test's Ray cluster. From there everything is OpenRLHF 0.11.2's own code: its parser with `rebn`, its checks,
`train(args)`: the placement group, the actor group (`RayActorGroup`), the `PPOTrainer` Ray actor with its
dataset loading (`blending_datasets`, `PromptDataset`, the dataloader), `fit()`: `SamplesGenerator`
dispatching prompts to the rollout actors (OpenRLHF's `generate_responses` and agent loader over the GEM
agent file), `_process_response_into_experience`, `make_experience_batch` (`split_rollout_samples` into
micro-batches of 5, 5 and 2 samples, shorter rows right-padded; the actor's forward for the log-probs;
the patched `compute_advantages_and_returns`), the replay buffer, `ppo_train`'s `training_step` (OpenRLHF's
`Actor` forward, `PolicyLoss`, gradient accumulation windows), the optimizer step, the metrics it logs, the
final `save_model`. Stand-ins (ray_step_actors.py): the vLLM engines (gem_core's vLLM-faithful engine), the
DeepSpeed engine (torch AdamW over fp32 masters, DeepSpeed's 1/gas loss scaling), CUDA device calls in the
actor process, `vllm.SamplingParams`; the weight sync into vLLM (CUDA IPC / NCCL) is only counted.
One request is aborted by the engine: that episode must be out of the loss and of ReBN, and counted.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fresh_copy

from gem_core.algo import rebn
from gem_core.tasks import TaskSpec

SCRIPT = "examples/openrlhf/train_gtn_rebn.sh"
# What a user with one GPU appends to the script (its "$@"): one GPU for actor, reference and vLLM; eager
# attention (flash-attn is GPU-only); a small batch: 2 steps of 3 prompts x 4 samples, in experience
# micro-batches of 5 (5, 5, 2: OpenRLHF right-pads the shorter rows of each) and training micro-batches of 4
# (3 per optimizer step, the gradient accumulation of train.batch_size 12).
CPU_ARGS = [
    "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
    "--ds.attn_implementation", "eager",
    "--data.max_samples", "6", "--rollout.batch_size", "3", "--rollout.micro_batch_size", "5",
    "--train.batch_size", "12", "--train.micro_batch_size", "4",
]  # fmt: skip
ABORTED_REQUEST = "req-7"  # the rollout engine's 7th request: one episode's turn (an infrastructure failure)


@pytest.fixture(scope="module")
def model_dir():
    """A tiny random Qwen2 model and the test tokenizer, saved where OpenRLHF loads them by path."""
    from gem_core.testing import build_test_tokenizer, save_test_tokenizer
    from gem_core.tiny import build_tiny_model

    directory = tempfile.mkdtemp(prefix="gem-tiny-")
    build_tiny_model(len(build_test_tokenizer("qwen3"))).save_pretrained(directory)
    save_test_tokenizer(directory)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def script_arguments(clone: Path, env: dict[str, str], extra: list[str]) -> list[str]:
    """Run the example script in ``clone`` (its make-dataset for real); return the exact arguments it
    passes to `gem-core openrlhf train`, which is recorded instead of run."""
    from helpers.scripts import script_arguments as recorded

    return recorded(SCRIPT, ["openrlhf", "train"], env, extra, clone / "train-argv", cwd=clone)


@pytest.fixture(scope="module")
def step_run(cluster, model_dir, tmp_path_factory):
    """The launcher's main over the script's arguments, with the GPU pieces stood in (see the module doc)."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ray as trainer_ray
    import ray
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import ray_step_actors as stand_ins

    from gem_integrations.openrlhf import train_ppo_ray

    clone = fresh_copy(tmp_path_factory.mktemp("fresh-clone"))
    out = tmp_path_factory.mktemp("ckpt")
    data = clone / "data" / "gtn_prompts.jsonl"
    argv = script_arguments(clone, {"MODEL": model_dir, "DATA": str(data), "OUT": str(out)}, [*CPU_ARGS, "--ckpt.output_dir", str(out / "final")])
    saved = (trainer_ray.create_vllm_engines, ppo_actor.PolicyModelActor, ppo_trainer.PPOTrainer)
    trainer_ray.create_vllm_engines = stand_ins.cpu_vllm_engines
    ppo_actor.PolicyModelActor = stand_ins.CPUPolicyModelActor
    ppo_trainer.PPOTrainer = stand_ins.CPUPPOTrainer
    stand_ins.ABORT.clear()
    stand_ins.ABORT.add(ABORTED_REQUEST)
    stand_ins.ENGINE_CALLS.clear()
    stand_ins.ENGINES.clear()
    try:
        status = train_ppo_ray.main(argv)
        env_counts = ray.get([engine.env_counts.remote() for engine in stand_ins.ENGINES], timeout=60)
    finally:
        trainer_ray.create_vllm_engines, ppo_actor.PolicyModelActor, ppo_trainer.PPOTrainer = saved
        for engine in stand_ins.ENGINES:
            ray.kill(engine)
        stand_ins.ENGINES.clear()
    trainer = torch.load(out / stand_ins.TRAINER_REPORT, weights_only=False)
    policy = torch.load(out / stand_ins.POLICY_REPORT, weights_only=False)
    return {
        "status": status,
        "argv": argv,
        "data": data,
        "out": out,
        "trainer": trainer,
        "policy": policy,
        "engines": list(stand_ins.ENGINE_CALLS),
        "env_counts": env_counts,
    }


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_script_arguments_run_openrlhfs_train_to_the_end(step_run, model_dir):
    from gem_integrations.openrlhf import agent_path

    argv = step_run["argv"]
    assert step_run["status"] == 0
    assert argv[argv.index("--algo.advantage.estimator") + 1] == "rebn" and argv[argv.index("--train.agent_func_path") + 1] == agent_path()
    assert argv[-len(CPU_ARGS) - 2 : -2] == CPU_ARGS  # appended after the script's own arguments
    rows = step_run["data"].read_text().splitlines()
    assert len(rows) == 4096 and TaskSpec.from_json(json.loads(rows[0])["label"]).max_turn_tokens == 1024
    (engines,) = step_run["engines"]  # OpenRLHF's train() asked for the vLLM engines with the agent file
    assert engines["num_engines"] == 1 and engines["agent_func_path"] == agent_path() and engines["max_len"] == 4096
    assert engines["pretrain"] == model_dir
    trainer = step_run["trainer"]
    assert trainer["patched"] and [log["global_step"] for log in trainer["logs"]] == [1, 2]
    assert (step_run["out"] / "final" / "config.json").is_file()  # OpenRLHF's final save_model ran
    assert step_run["env_counts"] == [{"made": 24, "closed": 24}]  # every episode's env closed, the aborted one too


def turn_rows(batch_record):
    """Per sample of a recorded micro-batch: (turn rewards, spans, infra flag)."""
    rewards, spans, infra = batch_record["gem_turn_rewards"], batch_record["gem_turn_spans"], batch_record["gem_infra_failed"]
    out = []
    for r, s, f in zip(rewards.tolist(), spans.tolist(), infra.tolist()):
        pairs = [(int(a), int(b)) for a, b in zip(s[::2], s[1::2]) if b > 0]
        out.append((r[: len(pairs)], pairs, bool(f)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_step_pads_micro_batches_and_rebn_excludes_the_aborted_episode(step_run):
    batches_per_step = step_run["trainer"]["advantage_batches"]
    assert len(batches_per_step) == 2
    failed_total = 0
    for batches in batches_per_step:
        assert [len(b["sequences"]) for b in batches] == [5, 5, 2]  # split_rollout_samples' micro-batches
        lengths = [b["attention_mask"].sum(-1) for b in batches]
        assert any(int(n.min()) < b["attention_mask"].shape[1] for n, b in zip(lengths, batches))  # OpenRLHF padded rows
        samples = [(b, i, row) for b in batches for i, row in enumerate(turn_rows(b))]
        healthy = [(b, i, r, spans) for b, i, (r, spans, failed) in samples if not failed]
        failed = [(b, i) for b, i, (_, _, f) in samples if f]
        failed_total += len(failed)
        for b, i in failed:  # out of the loss and out of the statistics
            assert int(b["action_mask"][i].sum()) == 0 and float(b["advantages"][i].abs().sum()) == 0.0
        # ReBN over the healthy episodes' turns only (gamma 0.9, population std, eps 1e-6: the script's)
        flat = list(rebn([r for _, _, r, _ in healthy], gamma=0.9, ddof=0, eps=1e-6))
        expected = [[flat.pop(0) for _ in r] for _, _, r, _ in healthy]
        for (b, i, r, spans), turn_advantages in zip(healthy, expected):
            advantages, mask = b["advantages"][i].double().numpy(), b["action_mask"][i].bool().numpy()
            starts = [s - 1 for s, _ in spans]  # OpenRLHF's action axis is shifted by one
            ends = [*starts[1:], spans[-1][1] - 1]
            for (a, z), want in zip(zip(starts, ends), turn_advantages):
                np.testing.assert_allclose(advantages[a:z][mask[a:z]], want, atol=1e-5)
            assert not advantages[~mask].any()
        counts = torch.cat([b["info"]["gem/infra_failed_episodes"] for b in batches])
        assert set(counts.tolist()) == {float(len(failed))}
    assert failed_total == 1  # exactly one request was aborted


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_loss_inputs_are_the_advantages_and_the_optimizer_steps(step_run):
    policy, trainer = step_run["policy"], step_run["trainer"]
    assert policy["accumulated_gradient"] == 3 and policy["optimizer_steps"] == 2  # one per step: 3 micro-batches of 4
    steps = policy["steps"]
    assert len(steps) == 6 and all(len(s["sequences"]) == 4 for s in steps)
    # Each training micro-batch's advantages are the ones the trainer computed for the same sequence
    # (the replay buffer strips the padding and OpenRLHF re-pads each training micro-batch).
    computed = {}
    for batches in trainer["advantage_batches"]:
        for b in batches:
            for seq, attention, adv in zip(b["sequences"], b["attention_mask"], b["advantages"]):
                n = int(attention.sum())
                computed.setdefault(tuple(seq[:n].tolist()), []).append(adv[: n - 1])
    assert sum(map(len, computed.values())) == 24
    for step in steps:
        assert np.isfinite(step["policy_loss"])
        for seq, attention, adv in zip(step["sequences"], step["attention_mask"], step["advantages"]):
            n = int(attention.sum())
            assert any(torch.equal(adv[: n - 1], c) for c in computed[tuple(seq[:n].tolist())])
    # The global token count each window normalises by is the masked tokens of its 3 micro-batches.
    for window in (steps[:3], steps[3:]):
        tokens = sum(int(s["action_mask"].sum()) for s in window)
        assert all(s["loss_batch_info"]["batch_num_tokens"] == pytest.approx(tokens / 3) for s in window)
    first, second = policy["updates"]
    assert first["lr"] == 0.0 and first["master_update_norm"] == 0.0  # OpenRLHF's warmup: lr 0 at step 1
    assert second["lr"] > 0 and second["grad_norm"] > 0 and second["master_update_norm"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_openrlhf_logs_the_gem_metrics_and_the_infra_count(step_run):
    logs = step_run["trainer"]["logs"]
    for log in logs:
        assert log["rollout/num_samples"] == 12.0
        for key in ("policy_loss", "actor_grad_norm", "gem_episode_length", "gem_success", "gem_infra_failed", "gem/infra_failed_episodes"):
            assert key in log, key
        assert "gem_turn_rewards" not in log and "gem_turn_spans" not in log
    counts = [log["gem/infra_failed_episodes"] for log in logs]
    fractions = [log["gem_infra_failed"] for log in logs]
    assert sorted(counts) == [0.0, 1.0] and sorted(fractions) == [0.0, pytest.approx(1 / 12)]
    assert step_run["policy"]["broadcasts"] == 2  # fit() asked for a weight sync into vLLM after each step
