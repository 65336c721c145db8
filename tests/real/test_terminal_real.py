"""The real model (SmolLM2-135M-Instruct in the real vLLM) plays the Terminal env through the core runner.

Whatever the small model writes, the structure must hold: turns recorded token in token out, every
reward one the env can give, every message bounded, and no sandbox process left once the env closes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from sandbox_support import require_bwrap  # noqa: E402

import gem_core  # noqa: E402
from gem_core.core import MAX_OBSERVATION_CHARS  # noqa: E402
from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, VLLMPolicy, run_episodes  # noqa: E402
from gem_core.envs.terminal.shell import living_sandbox_processes  # noqa: E402

pytest.importorskip("vllm")

# A turn's reward: a command (0), a format error or a time limit (-0.1), the checker at the end (+1).
STEP_REWARDS = {0.0, -0.1, 1.0, 0.9}


def _sandbox_processes() -> list[int]:
    return living_sandbox_processes()


def test_real_model_plays_two_terminal_episodes(llm, tokenizer):
    import vllm

    require_bwrap()
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", max_turns=3, command_timeout=5.0, max_output_bytes=512)
    policy = VLLMPolicy(llm, seed=0, sampling_params_cls=vllm.SamplingParams)
    config = RunConfig(params=SamplingParams(max_tokens=48, temperature=1.0), max_context_tokens=1024)
    try:
        trajectories = asyncio.run(run_episodes([env], policy, ChatFormatter(tokenizer), config, seeds=[0, 1]))
    finally:
        env.close()
    assert len(trajectories) == 2
    for trajectory in trajectories:
        assert trajectory.turns and trajectory.infra_error is None
        assert trajectory.done and 1 <= trajectory.num_turns <= 3
        for turn in trajectory.turns:
            assert turn.response_ids and len(turn.logprobs) == len(turn.response_ids)
            assert any(abs(turn.reward - r) < 1e-9 for r in STEP_REWARDS), turn.reward
            assert turn.info.get("task", "count-errors") == "count-errors"
            assert len(turn.observation) <= MAX_OBSERVATION_CHARS
        sequence = trajectory.as_sequence()
        assert len(sequence.loss_mask) == len(sequence.response_ids)
    assert _sandbox_processes() == []
