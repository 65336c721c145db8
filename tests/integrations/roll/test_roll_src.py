"""ROLL's own code on CPU, from a ROLL checkout (`ROLL_SRC=path nox -s roll_src`; skipped without it).

Real ROLL: ``StepEnvManager`` (``__init__`` making the env with ``gem.make(env_id=...)``, loaded through
``safe_import_class`` from ``env_manager_cls``; ``run_rollout_loop``, ``reset``, ``make_decision``,
``format_messages``, ``step``, ``formulate_rollouts``), ``create_llm_proxy``/``register_llm_proxy``,
``DataProto``, and the advantage path of the agentic pipeline: ``compute_discounted_returns``
(``step_reinforce``), ``compute_response_level_rewards`` with ``RewardNormalizationConfig(grouping=batch,
method=mean_std)``, ``expand_to_token_level`` and ``agentic_compute_advantage``. No import stubs are
needed: ROLL's agentic modules import on CPU with the light deps the session installs.

Stand-ins: the inference engine (an LLM proxy registered through ROLL's own ``register_llm_proxy`` that
answers with the golden reference's token ids), ROLL's ``GroupQueueManager`` (its ``get_episode_id`` /
``put`` remote calls, answered through a local Ray object store; it stops the manager once the episode is
in, as ROLL's scheduler does), and plain namespaces for the worker and pipeline configs (the fields the
manager reads).
"""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace

import pytest

ROLL_SRC = os.environ.get("ROLL_SRC")
if not ROLL_SRC:
    pytest.skip("ROLL_SRC is not set: the tests against ROLL's own code need a ROLL checkout (ROLL_SRC=path nox -s roll_src)", allow_module_level=True)
if not os.path.isdir(os.path.join(ROLL_SRC, "roll", "pipeline", "agentic")):
    pytest.fail(f"ROLL_SRC={ROLL_SRC} is not a ROLL checkout (no roll/pipeline/agentic)", pytrace=False)
sys.path.insert(0, os.path.abspath(ROLL_SRC))

import gem  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from roll.distributed.scheduler.protocol import DataProto  # noqa: E402
from roll.pipeline.agentic.agentic_config import LLMProxyConfig, RewardNormalizationConfig  # noqa: E402
from roll.pipeline.agentic.env_manager.step_env_manager import StepEnvManager  # noqa: E402
from roll.pipeline.agentic.llm_proxy import BaseLLMProxy, register_llm_proxy  # noqa: E402
from roll.pipeline.agentic.utils import agentic_compute_advantage, compute_discounted_returns, compute_response_level_rewards  # noqa: E402
from roll.utils.functionals import expand_to_token_level  # noqa: E402
from roll.utils.import_utils import safe_import_class  # noqa: E402

from gem_integrations.roll.env import ENV_TYPE  # noqa: E402

MANAGER_CLS = "gem_integrations.roll.env_manager.StepEnvManager"
MAX_TOKENS = 40  # the golden scenario's max_tokens: ROLL's max_tokens_per_step
REPLAY: list[list[int]] = []  # the responses the stand-in engine gives next, in order


@register_llm_proxy("gem_golden_replay")
class ReplayProxy(BaseLLMProxy):
    """Stand-in for the inference engine: the reference's response token ids, one per call."""

    def generate(self, messages, lm_input, generation_config):
        ids = REPLAY.pop(0)
        assert len(ids) <= generation_config["max_new_tokens"]
        lm_input.batch["responses"] = torch.tensor([ids], dtype=torch.long)
        return lm_input


class EpisodeQueue:
    """Stand-in for ROLL's GroupQueueManager: hands out episode id 0, keeps the rollout, then stops."""

    def __init__(self):
        self.manager = None
        self.rollouts: list = []
        self.handed = False
        self.get_episode_id = SimpleNamespace(remote=self._get_episode_id)
        self.put = SimpleNamespace(remote=self._put)

    def _get_episode_id(self, group_id, env_id):
        episode = None if self.handed else 0
        self.handed = True
        return ray.put(episode)

    def _put(self, group_id, episode_id, start_step, rollout, env_id):
        if rollout is not None:
            self.rollouts.append(rollout)
            self.manager.stop()
        return ray.put(None)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def run_episode(tokenizer, config: dict, seed: int, responses: list[list[int]], max_steps: int, env_type: str = ENV_TYPE, env_id: int = 0):
    """One episode through ROLL's StepEnvManager.run_rollout_loop; returns its DataProto of per-step samples.
    ``env_id`` (and the group id): distinct per env, as ROLL's make_env_configs numbers them; step_reinforce
    groups samples into trajectories by the traj_id built from them."""
    REPLAY[:] = [list(r) for r in responses]
    tag = "GemCore"
    template = {"agent_system_template": None, "agent_template": "{current_observation}", "max_tokens_per_step": MAX_TOKENS}
    pipeline_config = SimpleNamespace(custom_envs={tag: template}, sequence_length=4096, skip_mock_system_prompt=True)
    generating_args = SimpleNamespace(max_new_tokens=MAX_TOKENS, to_dict=lambda: {"max_new_tokens": MAX_TOKENS, "temperature": 1.0})
    worker_config = SimpleNamespace(llm_proxy=LLMProxyConfig(proxy_type="gem_golden_replay"), generating_args=generating_args)
    env_config = DictConfig({
        "tag": tag, "env_type": env_type, "config": dict(config), "group_id": env_id, "env_id": env_id, "group_seed": seed,
        "max_steps": max_steps, "max_tokens_per_step": MAX_TOKENS, "env_manager_cls": MANAGER_CLS,
    })  # fmt: skip
    manager_cls = safe_import_class(env_config["env_manager_cls"])  # how ROLL's EnvironmentWorker loads it
    queue = EpisodeQueue()
    manager = manager_cls(worker_config=worker_config, pipeline_config=pipeline_config, env_config=env_config, tokenizer=tokenizer,
                          generate_scheduler=None, output_queue=queue, thread_lock=threading.Lock(), mode="train")  # fmt: skip
    queue.manager = manager
    manager.run_rollout_loop(DataProto(meta_info={"seed": 0}))  # episode seed: 0 + group_seed + episode id 0
    assert len(queue.rollouts) == 1 and not REPLAY
    return queue.rollouts[0]


def test_env_manager_cls_is_roll_s_own_step_env_manager():
    assert safe_import_class(MANAGER_CLS) is StepEnvManager
    assert ENV_TYPE in gem.envs.registration.ENV_REGISTRY


def test_golden_scenario_through_roll_s_step_env_manager_and_step_reinforce(golden_roll, tokenizer):
    scenario = golden_roll
    batches = []
    for index, (episode, trajectory) in enumerate(zip(scenario.episodes, scenario.trajectories)):
        cut = trajectory.truncation_reason == "context_limit"  # ROLL's own limit ends it there: max_steps
        config = {"env": episode.env_id, "env_kwargs": dict(episode.env_kwargs), "tools": list(episode.tools)}
        batch = run_episode(tokenizer, config, episode.seed, [t.response_ids for t in trajectory.turns], len(trajectory.turns) if cut else 100, env_id=index)
        steps = batch.non_tensor_batch["step"].tolist()
        assert steps == list(range(trajectory.num_turns)), episode.episode_id
        assert [float(s) for s in batch.non_tensor_batch["step_scores"]] == trajectory.rewards, episode.episode_id
        shown = [tokenizer.decode(trajectory.prompt_ids, skip_special_tokens=False)] + [t.message for t in trajectory.turns]
        for row, message in enumerate(shown[: trajectory.num_turns]):
            prompt = batch.batch["input_ids"][row][batch.batch["prompt_mask"][row].bool()].tolist()
            text = tokenizer.decode(prompt, skip_special_tokens=False)
            assert message.strip() and (message in text or text.strip() in message), (episode.episode_id, row)
            response = batch.batch["input_ids"][row][batch.batch["response_mask"][row].bool()].tolist()
            assert response == trajectory.turns[row].response_ids, (episode.episode_id, row)
        batches.append(batch)

    batch = DataProto.concat(batches)
    batch = compute_discounted_returns(batch, "step_reinforce", scenario.gamma)
    config = SimpleNamespace(adv_estimator="step_reinforce", reward_normalization=RewardNormalizationConfig(grouping="batch", method="mean_std"), reward_clip=None)
    batch, _ = compute_response_level_rewards(batch=batch, pipeline_config=config)
    batch.batch["token_level_rewards"] = expand_to_token_level(batch)
    batch = agentic_compute_advantage(batch, gamma=1.0, lambd=0.95, adv_estimator="step_reinforce", advantage_clip=None, whiten_advantages=False, whiten_rewards=False)

    returns = np.concatenate([np.asarray(r) for r in scenario.turn_returns])
    reference = np.concatenate([np.asarray(a) for a in scenario.turn_advantages])
    np.testing.assert_allclose(batch.batch["step_rewards"].numpy(), returns, rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch.batch["response_level_rewards"].numpy(), reference, rtol=0, atol=1e-5)
    mask = batch.batch["response_mask"][:, 1:].bool()
    advantages = batch.batch["advantages"]
    for row, value in enumerate(reference):
        tokens = advantages[row][mask[row]].numpy()
        assert tokens.size > 0
        np.testing.assert_allclose(tokens, value, rtol=0, atol=1e-5)
        assert not advantages[row][~mask[row]].any()


def test_a_gem_core_time_limit_ends_roll_s_episode(tokenizer):
    responses = [tokenizer.encode("\\boxed{1}<|im_end|>", add_special_tokens=False)] * 2
    batch = run_episode(tokenizer, {"env": "game:GuessTheNumber-v0-hard", "max_turns": 2}, 0, responses, max_steps=50)
    assert batch.non_tensor_batch["step"].tolist() == [0, 1]
    assert batch.meta_info["metrics"]["env/GemCore/truncated"] == 1.0


class _TruncatedOnly(gem.Env):
    """A plain gem env that reports truncated=True and never terminated (what ROLL would step past)."""

    def __init__(self, instruction: bool = True):
        super().__init__()
        self.instruction = instruction

    def reset(self, seed=None):
        return "go", ({"env_instruction": ""} if self.instruction else {})

    def step(self, action):
        return "again", 0.0, False, True, {}


def test_roll_keeps_stepping_on_truncated_alone_and_needs_env_instruction(tokenizer):
    from gem.envs.registration import ENV_REGISTRY

    ENV_REGISTRY.pop("gem-core-test-truncated", None)
    gem.register("gem-core-test-truncated", entry_point=_TruncatedOnly)
    try:
        responses = [tokenizer.encode("x<|im_end|>", add_special_tokens=False)] * 3
        batch = run_episode(tokenizer, {}, 0, responses, max_steps=3, env_type="gem-core-test-truncated")
        assert batch.non_tensor_batch["step"].tolist() == [0, 1, 2]  # ended by max_steps, not by truncated
        with pytest.raises(KeyError, match="env_instruction"):
            run_episode(tokenizer, {"instruction": False}, 0, responses[:1], max_steps=1, env_type="gem-core-test-truncated")
    finally:
        ENV_REGISTRY.pop("gem-core-test-truncated", None)
        REPLAY.clear()
