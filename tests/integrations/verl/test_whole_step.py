"""One whole verl training step from the documented example, examples/verl/run_gem_sudoku.sh, on CPU.

whole_step.py (run here in its own process: it picks verl's platform, a gloo process group and Ray)
reads the script itself: its `gem-core make-dataset verl` lines run as written and its `main_ppo`
overrides are composed by hydra, followed by CPU sizes passed as the script's "$@" (3 prompts x
rollout.n 4 = 12 episodes, an actor mini-batch of 8 rows: verl pads the batch to 16). Then verl's own v1
trainer runs one `PPOTrainer.step`: dataloader -> AgentLoopManagerTQ / AgentLoopWorkerTQ (the gem_env
loop) over LLMServerClient and a CPU server stand-in -> replay buffer -> `_balance_batch` ->
`_compute_old_log_prob` and `_update_actor` on verl's ActorRolloutRefWorker (FSDP2 engine, ppo_loss,
AdamW, on the CPU) -> `_compute_advantage` (rebn) -> `_compute_metrics`. What a GPU run adds is listed
in whole_step.py's docstring and in examples/verl/README.md.

Checked here against gem_core, independently: every real row equals the core runner's episode with the
same scripted player, env and seed (tokens, loss mask, turn ids, per-turn rewards); every real row's
advantages are ReBN over the 12 episodes' turns (gamma 0.9 from the script, population std), verl's 4
padding rows carry none; the optimizer step moved the weights.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verl_server import sudoku_respond

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[2] / "examples" / "verl" / "run_gem_sudoku.sh"

pytest.importorskip("ray")
pytest.importorskip("transfer_queue")


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """whole_step.py's report of the step (see its docstring)."""
    workdir = tmp_path_factory.mktemp("whole_step")
    out = workdir / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run(
        [sys.executable, str(HERE / "whole_step.py"), str(EXAMPLE), str(workdir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0 and out.exists(), result.stderr[-6000:]
    return json.loads(out.read_text())


def test_the_scripts_own_commands_and_overrides_ran(step):
    script = EXAMPLE.read_text()
    assert [argv[:2] for argv in step["make_dataset"]] == [["make-dataset", "verl"]] * 2
    assert script.count("gem-core make-dataset verl") == 2
    assert (step["train_dataset_size"], step["val_dataset_size"]) == (1024, 64)  # the script's --n values
    for override in (
        "algorithm.adv_estimator=rebn",
        "+algorithm.rebn_gamma=0.9",
        "actor_rollout_ref.rollout.agent.default_agent_loop=gem_env",
        "trainer.use_v1=True",
    ):
        assert override in script and override in step["overrides"]
    assert step["config"]["n"] == 4  # the script's rollout.n, kept
    assert step["patches_applied"] == [True, True, True]  # the plugin's start-up check, turn-id and infra patches, loaded by verl


def test_verl_padded_the_batch_and_padding_carries_nothing(step):
    real = [row for row in step["rows"] if not row["is_padding"]]
    padding = [row for row in step["rows"] if row["is_padding"]]
    assert len(real) == 3 * 4 and len(padding) == 4  # 12 episodes padded to a multiple of 2 x 4 rows
    for row in padding:
        assert row["response_mask"] == [0] and not any(row["advantages"])
    assert step["metrics"]["gem/padding_rows"] == 4.0
    assert step["metrics"]["gem/infra_failed_episodes"] == 0.0
    assert step["metrics"]["gem/turn_ids_from_mask"] == 0.0


def _core_episode(row, response_length: int):
    """The same episode through gem_core's runner: the row's env and seed, the server's scripted player."""
    from gem_core.rollout import RunConfig, SamplingParams, ScriptedPolicy, run_episode
    from gem_core.tasks import TaskSpec
    from gem_core.testing import build_test_tokenizer
    from gem_core.testing.golden import golden_formatter

    tokenizer = build_test_tokenizer("qwen3")
    spec = TaskSpec.from_columns({"env_id": row["env_id"], "env_seed": row["env_seed"]})
    env = spec.make_env()
    try:
        config = RunConfig(params=SamplingParams(max_tokens=1024), max_context_tokens=len(row["prompts"]) + response_length)
        return asyncio.run(run_episode(env, ScriptedPolicy(tokenizer, sudoku_respond), golden_formatter(tokenizer), config, seed=spec.seed))
    finally:
        env.close()


def test_rows_are_the_core_runners_episodes_and_advantages_are_rebn(step):
    from gem_core.algo import rebn

    real = [row for row in step["rows"] if not row["is_padding"]]
    episodes, cache = [], {}
    for row in real:
        key = (row["env_id"], row["env_seed"])
        if key not in cache:
            cache[key] = _core_episode(row, step["config"]["response_length"])
        trajectory = cache[key]
        view = trajectory.as_sequence()
        assert row["prompts"] == view.prompt_ids
        assert row["responses"] == view.response_ids
        assert row["response_mask"] == view.loss_mask
        assert row["gem_turn_ids"] == view.turn_ids
        assert row["rm_scores"] == pytest.approx(view.token_rewards(), abs=1e-6)
        episodes.append(trajectory.rewards)
    assert len({tuple(e) for e in episodes}) > 1 and len({r for e in episodes for r in e}) > 1  # returns differ

    flat = list(rebn(episodes, gamma=0.9, ddof=0, eps=1e-6))  # every turn of the batch, episode by episode
    per_turn = [flat[sum(map(len, episodes[:i])) : sum(map(len, episodes[: i + 1]))] for i in range(len(episodes))]
    for row, advantages in zip(real, per_turn):
        expected = [advantages[t] if m else 0.0 for t, m in zip(row["gem_turn_ids"], row["response_mask"])]
        np.testing.assert_allclose(row["advantages"], expected, atol=1e-5)


def test_the_actor_update_ran_on_the_loss(step):
    metrics = step["metrics"]
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
        assert math.isfinite(metrics[name]), name
    assert metrics["actor/grad_norm"] > 0.0
    assert step["weight_change"] > 0.0  # the optimizer step moved the weights
    for row in step["rows"]:
        if not row["is_padding"]:
            assert len(row["old_log_probs"]) == len(row["responses"])  # the actor's own forward pass
            assert all(math.isfinite(x) and x <= 0.0 for x in row["old_log_probs"])
