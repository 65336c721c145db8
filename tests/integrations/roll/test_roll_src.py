"""ROLL's own code on CPU, from a ROLL checkout (`ROLL_SRC=path nox -s roll_src`; skipped without it).

Real ROLL: the config (``AgenticConfig`` built by dacite, as ROLL's ``examples/start_agentic_pipeline.py`` does, from
ROLL's own GEM example composed by Hydra with ``examples/roll/gem_core_rebn.yaml`` merged in: its ``make_env_configs``
makes every env config), ``StepConcatEnvManager``/``StepEnvManager`` (``__init__`` making the env with
``gem.make(env_id=...)``, loaded through ``safe_import_class`` from ``env_manager_cls``; ``run_rollout_loop``,
``reset``, ``make_decision``, ``format_messages``, ``step``, ``formulate_rollouts``),
``create_llm_proxy``/``register_llm_proxy``, ``DataProto``, ``GroupQueue`` with the ``group_filter_cls`` the example
names, ``reduce_metrics``, and the agentic pipeline's step after the rollout: ``compute_discounted_returns``
(``step_reinforce``), ``AgenticPipeline.adjust_batch``, ``get_agentic_response_level_mask``,
``compute_response_level_rewards`` (``RewardNormalizationConfig(grouping=batch, method=mean_std)``),
``compute_token_reward``, ``agentic_compute_advantage`` and ``batch_balance``. No import stubs are needed: ROLL's
agentic modules import on CPU with the light deps the session installs.

Stand-ins: the inference engine (LLM proxies registered through ROLL's own ``register_llm_proxy``: one answers with
the golden reference's token ids; one records every prompt ROLL's manager sends and answers by reading that prompt,
so a prompt without the rules or the earlier turns loses the game), the queue's Ray actor (its ``get_episode_id`` /
``put`` remote calls answered in-process, by ROLL's own ``GroupQueue`` where the test is about it), the
``AgenticPipeline`` object around ``adjust_batch`` (the config and the data-parallel sizes it reads), and plain
namespaces for the worker and pipeline configs in the golden-scenario tests.

Left for a GPU (not run here): the vLLM/SGLang engine behind ROLL's ``PolicyProxy`` and its ``RouterManager``,
the Ray clusters of ``AgenticPipeline.__init__``, ``actor_train.compute_log_probs`` (old and reference log-probs),
``ActorWorker.loss_func``/``train_step`` with the Megatron strategy and its optimizer step, and the model update
to the inference engine.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import roll_rules

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

from gem_integrations.roll.rollout import ENV_TYPE  # noqa: E402
from gem_integrations.roll.group_filter import METRIC  # noqa: E402

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
    config = SimpleNamespace(
        adv_estimator="step_reinforce", reward_normalization=RewardNormalizationConfig(grouping="batch", method="mean_std"), reward_clip=None
    )
    batch, _ = compute_response_level_rewards(batch=batch, pipeline_config=config)
    batch.batch["token_level_rewards"] = expand_to_token_level(batch)
    batch = agentic_compute_advantage(
        batch, gamma=1.0, lambd=0.95, adv_estimator="step_reinforce", advantage_clip=None, whiten_advantages=False, whiten_rewards=False
    )

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


# ------------------------------------------------------------------------------------------------
# From the documented config: examples/roll/gem_core_rebn.yaml merged into ROLL's own GEM example.
# ------------------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "roll" / "gem_core_rebn.yaml"
ROLL_GEM_EXAMPLE = ("examples/qwen3_agentic_gem", "gem_game_guess_the_number")  # the config the yaml says to merge into
PROMPTS: list[dict] = []  # what the recording proxy received, in order
HOOKS: dict = {}  # "before_tool_call": called with the env before the proxy answers with a tool call


def documented_config(scratch: str):
    """ROLL's AgenticConfig as examples/start_agentic_pipeline.py builds it (Hydra compose, then dacite), from ROLL's
    GEM GuessTheNumber example with examples/roll/gem_core_rebn.yaml merged over it; only the LLM proxy is swapped,
    and ROLL's example's ./output paths point into ``scratch``."""
    import dacite
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from roll.pipeline.agentic.agentic_config import AgenticConfig

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(os.path.abspath(ROLL_SRC), ROLL_GEM_EXAMPLE[0]), version_base=None):
        base = compose(config_name=ROLL_GEM_EXAMPLE[1])
    OmegaConf.set_struct(base, False)  # the yaml adds keys ROLL's example does not set, as a user's edit would
    merged = OmegaConf.merge(base, OmegaConf.load(EXAMPLE))
    merged.logging_dir, merged.output_dir = os.path.join(scratch, "logs"), os.path.join(scratch, "output")
    saved = random.getstate()
    random.seed(0)  # make_env_configs draws each group's seed from Python's random: fixed episodes
    try:
        config = dacite.from_dict(data_class=AgenticConfig, data=OmegaConf.to_container(merged, resolve=True))
    finally:
        random.setstate(saved)
    config.documented_proxy_types = (config.train_env_manager.llm_proxy.proxy_type, config.val_env_manager.llm_proxy.proxy_type)
    config.train_env_manager.llm_proxy = LLMProxyConfig(proxy_type="gem_prompt_reader")
    config.pipeline_cls = merged.get("pipeline_cls")  # start_agentic_pipeline.py reads it from the composed config
    return config


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return str(tmp_path_factory.mktemp("roll-src"))  # ROLL's example writes ./output/...: not into the checkout


@pytest.fixture(scope="module")
def config(scratch):
    return documented_config(scratch)


def first_env_config(config, tag: str) -> DictConfig:
    """The first env config ROLL's make_env_configs made for ``tag`` (train)."""
    for rank_configs in config.train_env_manager.env_configs.values():
        for env_config in rank_configs.values():
            if env_config["tag"] == tag:
                return env_config
    raise AssertionError(f"no env config for {tag}")


def guess_the_number_move(prompt: str, tool: bool) -> str:
    """A player that knows only the prompt: the range from the rules, narrowed by every earlier guess's feedback."""
    low, high = (int(x) for x in re.search(r"between (\d+) and (\d+)", prompt).groups())
    for guess, side in re.findall(r"you guessed (\d+), and the target number is (higher|lower) than", prompt):
        low, high = (max(low, int(guess) + 1), high) if side == "higher" else (low, min(high, int(guess) - 1))
    middle = (low + high) // 2
    if tool and "<output>\n" not in prompt:  # no tool output yet (the rules name <output>...</output>)
        return f"Let me compute the middle.\n<python>print(({low} + {high}) // 2)</python>"
    return f"I guess \\boxed{{{middle}}}."


def sudoku_move(prompt: str) -> str:
    """A player that knows only the prompt: solves the grid shown under the last 'Here is the current grid:'."""
    block = prompt.rsplit("Here is the current grid:", 1)[1]
    rows = [re.findall(r"[\d.]", line.split("|", 1)[1]) for line in block.splitlines() if re.match(r"^\s*\d+\s*\|", line)]
    n = len(rows)
    box = int(n**0.5)
    grid = [[0 if c == "." else int(c) for c in row] for row in rows]

    def ok(r, c, d):
        br, bc = r - r % box, c - c % box
        return (
            all(grid[r][j] != d for j in range(n))
            and all(grid[i][c] != d for i in range(n))
            and all(grid[i][j] != d for i in range(br, br + box) for j in range(bc, bc + box))
        )

    def solve():
        for r in range(n):
            for c in range(n):
                if not grid[r][c]:
                    for d in range(1, n + 1):
                        if ok(r, c, d):
                            grid[r][c] = d
                            if solve():
                                return True
                            grid[r][c] = 0
                    return False
        return True

    empty = [(r, c) for r in range(n) for c in range(n) if not grid[r][c]]
    assert empty and solve()
    r, c = empty[0]
    return f"\\boxed{{{r + 1} {c + 1} {grid[r][c]}}}"


@register_llm_proxy("gem_prompt_reader")
class PromptReaderProxy(BaseLLMProxy):
    """Stand-in for the engine that records the prompt ROLL's manager sends (its messages and its token ids, decoded)
    and answers from what that prompt says, like a model would."""

    def generate(self, messages, lm_input, generation_config):
        prompt = self.tokenizer.decode(lm_input.batch["input_ids"][0].tolist(), skip_special_tokens=False)
        PROMPTS.append({"env": self.env, "user": messages[-1]["content"] if messages else None, "prompt": prompt, "messages": [dict(m) for m in messages]})
        if "Sudoku" in self.env.spec.env_id:  # the bridge env's TaskSpec
            text = sudoku_move(prompt)
        else:
            text = guess_the_number_move(prompt, tool=bool(self.env.spec.tools))
            if "<python>" in text and "before_tool_call" in HOOKS:
                HOOKS["before_tool_call"](self.env)
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)[: generation_config["max_new_tokens"]]
        lm_input.batch["responses"] = torch.tensor([ids], dtype=torch.long)
        return lm_input


class LocalQueue:
    """ROLL's GroupQueueManager remote calls (get_episode_id, put) answered in-process: by ROLL's own GroupQueue when
    given one (ROLL's GroupQueueManager forwards to it the same way), else a plain list. Hands out ``episodes`` ids,
    then stops the manager."""

    def __init__(self, episodes: int, group_queue=None):
        self.episodes, self.group_queue = episodes, group_queue
        self.handed, self.rollouts, self.manager = 0, [], None
        self.get_episode_id = SimpleNamespace(remote=self._get_episode_id)
        self.put = SimpleNamespace(remote=self._put)

    def _get_episode_id(self, group_id, env_id=None):
        if self.handed >= self.episodes:
            self.manager.stop()
            return ray.put(None)
        self.handed += 1
        if self.group_queue is None:
            return ray.put(self.handed - 1)
        return ray.put(asyncio.run(self.group_queue.get_episode_id(env_id)))

    def _put(self, group_id, episode_id, start_step, rollout, env_id=None):
        if rollout is not None:
            self.rollouts.append(rollout)
            if self.group_queue is not None:
                self.group_queue.put(episode_id, start_step, rollout)
        return ray.put(None)


def play_documented(config, tokenizer, tag: str, episodes: int, group_queue=None, seed: int = 0):
    """``episodes`` episodes of env ``tag`` through the env manager the documented config names, with ROLL's own
    env config for it; returns the queue (its rollouts) and the manager."""
    env_config = first_env_config(config, tag)
    manager_cls = safe_import_class(env_config["env_manager_cls"])  # ROLL's EnvironmentWorker does this
    queue = LocalQueue(episodes, group_queue)
    manager = manager_cls(worker_config=config.train_env_manager, pipeline_config=config, env_config=env_config, tokenizer=tokenizer,
                          generate_scheduler=None, output_queue=queue, thread_lock=threading.Lock(), mode="train")  # fmt: skip
    queue.manager = manager
    manager.update_step(0)  # the scheduler's update_step(global_step) before the rollout (RolloutScheduler.get_batch)
    manager.run_rollout_loop(DataProto(meta_info={"seed": seed}))
    return queue, manager


def test_the_documented_config_builds_roll_s_config_with_the_bridge(config):
    assert config.adv_estimator == "step_reinforce" and config.step_reward_gamma == 0.9 and config.batch_adjust_mode == "delete"
    from gem_integrations.roll.pipeline import AgenticPipeline

    assert safe_import_class(config.pipeline_cls) is AgenticPipeline and config.advantage_clip >= 1e9 and config.reward_clip is None
    assert (config.reward_normalization.norm_mean_type, config.reward_normalization.norm_std_type) == ("batch", "batch")
    assert config.train_env_manager.tags == ["GemSudoku", "GemGuessTheNumberPython"]
    assert config.train_env_manager.group_filter_cls == "gem_integrations.roll.group_filter.InfraErrorGroupFilter"
    env_config = first_env_config(config, "GemGuessTheNumberPython")
    assert env_config["env_type"] == ENV_TYPE and env_config["config"]["suffix"] == "info"
    from roll.pipeline.agentic.env_manager.step_concat_env_manager import StepConcatEnvManager

    assert safe_import_class(env_config["env_manager_cls"]) is StepConcatEnvManager
    # the env_manager_cls lookup registered the documented llm_proxy, before a manager makes one
    from roll.pipeline.agentic.llm_proxy import LLM_PROXY_REGISTRY

    from gem_integrations.roll.llm_proxy import PolicyProxy

    assert config.documented_proxy_types == ("gem_core_policy", "gem_core_policy") and LLM_PROXY_REGISTRY["gem_core_policy"] is PolicyProxy


@pytest.mark.parametrize("tag", ["GemGuessTheNumberPython", "GemSudoku"])
def test_roll_s_manager_sends_the_rules_and_every_earlier_turn(config, tokenizer, tag):
    """The prompts ROLL's StepConcatEnvManager sends, from the documented config, hold the rules and every earlier
    turn, equal the contract's rendering (roll_rules.py) turn for turn, and carry a prompt-reading player to a win."""
    PROMPTS.clear()
    queue, manager = play_documented(config, tokenizer, tag, episodes=4)
    manager.env.close()
    assert len(queue.rollouts) == 4 and len(PROMPTS) == sum(len(r) for r in queue.rollouts)
    assert max(len(r) for r in queue.rollouts) >= 3, "an episode of three turns or more"
    cfg = {**config.custom_envs[tag]}
    env_config = first_env_config(config, tag)
    env = gem.make(env_id=env_config["env_type"], **env_config["config"])
    records = iter(PROMPTS)
    for episode, rollout in enumerate(queue.rollouts):
        assert rollout.meta_info["metrics"][f"env/{tag}/success"] == 1.0, episode  # won from what the prompts said
        # the same episode replayed by the contract's rules: ROLL's seed (data seed 0 + group seed + episode id), its responses
        observation, info = env.reset(seed=0 + env_config["group_seed"] + episode)
        history = roll_rules.reset_entry(observation, info, env_config["max_steps"])
        for step in range(len(rollout)):
            record = next(records)
            expected = roll_rules.format_messages(cfg, history, step, env_config["max_tokens_per_step"])
            assert record["user"] == expected[-1]["content"], (episode, step)  # ROLL's own text equals the contract's
            assert history[0]["observation"] in record["prompt"] and "\\boxed{" in history[0]["observation"], step  # the rules
            for earlier in history[1:step]:
                assert earlier["observation"] in record["prompt"], (episode, step, earlier["observation"])
            response = tokenizer.decode(rollout.batch["input_ids"][step][rollout.batch["response_mask"][step].bool()].tolist(), skip_special_tokens=False)
            roll_rules.record_step(history, response, env.step(action=response), step + 1, env_config["max_steps"])
    env.close()


def pipeline_object(config, dp_size: int, pipeline_cls: str | None = None):
    """The ``pipeline_cls`` the config names (start_agentic_pipeline.py's choice), without its __init__ (which starts
    the Ray clusters): the config and the data-parallel sizes adjust_batch reads."""
    cls = safe_import_class(pipeline_cls or config.pipeline_cls or "roll.pipeline.agentic.agentic_pipeline.AgenticPipeline")
    pipeline = cls.__new__(cls)
    pipeline.pipeline_config = config
    pipeline.actor_train = SimpleNamespace(dp_size=dp_size)
    pipeline.reference = SimpleNamespace(dp_size=dp_size)
    return pipeline


def pipeline_step(config, batch, dp_size: int):
    """The agentic pipeline's step after the rollout (AgenticPipeline.run, as read), with ROLL's functions and the
    documented config: returns, adjust_batch, the response-level mask, reward normalisation, token rewards, the
    advantage, and the balancing of the train step. The log-prob passes are GPU work: old_log_probs are zeros
    (ROLL's own path when enable_old_logprobs_recompute is off) and ref_log_probs a copy (no reference cluster)."""
    from roll.pipeline.agentic.utils import get_agentic_response_level_mask
    from roll.utils.functionals import batch_balance, compute_token_reward
    from roll.utils.kl_controller import get_kl_controller

    batch.non_tensor_batch["sample_uuid"] = np.array([f"{t}_{i}" for i, t in enumerate(batch.non_tensor_batch["traj_id"])], dtype=object)
    batch = compute_discounted_returns(batch, config.adv_estimator, config.step_reward_gamma)
    batch = pipeline_object(config, dp_size).adjust_batch(batch, mode=config.batch_adjust_mode)
    batch.batch["old_log_probs"] = torch.zeros_like(batch.batch["attention_mask"][:, 1:], dtype=torch.float)
    batch.batch["ref_log_probs"] = batch.batch["old_log_probs"].clone()
    batch, _ = get_agentic_response_level_mask(batch, config)
    batch, _ = compute_response_level_rewards(batch=batch, pipeline_config=config)
    kl_ctrl = get_kl_controller(init_kl_coef=config.init_kl_coef, target_kl=config.target_kl, kl_horizon=config.kl_horizon)
    batch, _ = compute_token_reward(batch, config, kl_ctrl)
    batch = agentic_compute_advantage(
        data=batch, gamma=config.gamma, lambd=config.lambd, adv_estimator=config.adv_estimator, advantage_clip=config.advantage_clip,
        whiten_advantages=config.whiten_advantages, whiten_rewards=config.whiten_rewards, pipeline_config=config,
    )  # fmt: skip
    train = config.actor_train.training_args
    batch_balance(batch, dp_size=dp_size, minibatch_size=dp_size * train.per_device_train_batch_size * train.gradient_accumulation_steps)
    return batch


def roll_rebn(returns: np.ndarray) -> np.ndarray:
    """ReBN as ROLL's batch mean_std computes it (torch.std: ddof 1, eps 1e-6)."""
    return (returns - returns.mean()) / (returns.std(ddof=1) + 1e-6)


def test_a_whole_step_from_the_documented_config(config, tokenizer):
    """Episodes of both envs through ROLL's manager, then ROLL's step up to the loss's inputs, with a data-parallel
    size whose train batch forces adjust_batch. Every sample that trains has the ReBN advantage of exactly the trained
    samples on every response token, no sample trains twice, and the returns are the per-turn discounted returns."""
    dp_size = 1
    train = config.actor_train.training_args
    divide = int(
        np.lcm.reduce(
            [
                train.per_device_train_batch_size * train.gradient_accumulation_steps * dp_size,
                config.actor_train.infer_batch_size * dp_size,
                config.reference.infer_batch_size * dp_size,
            ]
        )
    )
    PROMPTS.clear()
    rollouts = []
    for tag, episodes in [("GemGuessTheNumberPython", 3), ("GemSudoku", 2)]:
        queue, manager = play_documented(config, tokenizer, tag, episodes=episodes)
        rollouts += queue.rollouts
        manager.env.close()
    if sum(len(r) for r in rollouts) % divide == 0:  # one more episode, so that adjust_batch has work
        queue, manager = play_documented(config, tokenizer, "GemGuessTheNumberPython", episodes=1, seed=1)
        rollouts += queue.rollouts
        manager.env.close()
    played = DataProto.concat(rollouts)  # what the scheduler's get_batch hands the pipeline
    n_played = len(played)
    assert n_played % divide and n_played > divide, (n_played, divide, "the batch must force adjust_batch")
    batch = pipeline_step(config, played, dp_size)

    uuids = batch.non_tensor_batch["sample_uuid"].tolist()
    assert len(batch) == n_played - n_played % divide and len(set(uuids)) == len(uuids)  # delete: no sample twice
    returns = batch.batch["step_rewards"].numpy().astype(np.float64)
    # returns: G_t = r_t + gamma * G_{t+1} over each whole played episode (computed before adjust_batch)
    by_traj: dict = {}
    for i in range(n_played):
        by_traj.setdefault(played.non_tensor_batch["traj_id"][i], []).append(
            (played.non_tensor_batch["step"][i], float(played.non_tensor_batch["step_scores"][i]))
        )
    expected_return = {}
    for traj, steps in by_traj.items():
        running = 0.0
        for step, reward in sorted(steps, reverse=True):
            running = reward + config.step_reward_gamma * running
            expected_return[f"{traj}_{step}"] = running
    kept = [f"{t}_{s}" for t, s in zip(batch.non_tensor_batch["traj_id"], batch.non_tensor_batch["step"])]
    np.testing.assert_allclose(returns, [expected_return[k] for k in kept], rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch.batch["response_level_rewards"].numpy(), roll_rebn(returns), rtol=0, atol=1e-5)
    mask = batch.batch["response_mask"][:, 1:].bool()
    advantages = batch.batch["advantages"]
    for row, value in enumerate(roll_rebn(returns)):
        assert mask[row].any() and not advantages[row][~mask[row]].any()
        np.testing.assert_allclose(advantages[row][mask[row]].numpy(), value, rtol=0, atol=1e-5)
    # the loss's inputs (ActorWorker.loss_func reads these)
    for key in ["input_ids", "attention_mask", "response_mask", "advantages", "old_log_probs", "ref_log_probs"]:
        assert key in batch.batch.keys(), key
    assert {"GemGuessTheNumberPython", "GemSudoku"} == set(batch.non_tensor_batch["tags"].tolist())


def test_roll_s_own_delete_raises_and_the_plugin_s_keeps_each_sample_once(config, tokenizer):
    """ROLL 8eb27cc's adjust_batch(mode="delete") indexes data.batch with a mask that its BatchProxy refuses; the
    pipeline_cls the example names deletes the same number of samples, at random, each kept sample once, with ROLL's
    own divisor (train batch per_device * accumulation * dp, the infer batches) and its fallback to copy."""
    queue, manager = play_documented(config, tokenizer, "GemSudoku", episodes=2)
    manager.env.close()
    played = DataProto.concat(queue.rollouts)
    played.meta_info = {"metrics": {}}
    n = len(played)
    assert n % 16, n  # the documented config's divisor at dp 1: lcm(2 * 8, 2, 2)
    with pytest.raises(RuntimeError, match="NestedKey"):
        pipeline_object(config, 1, "roll.pipeline.agentic.agentic_pipeline.AgenticPipeline").adjust_batch(played, mode="delete")
    for dp_size in [1, 2]:
        divisor = 16 * dp_size
        played.meta_info = {"metrics": {}}
        adjusted = pipeline_object(config, dp_size).adjust_batch(played, mode="delete")
        if n < divisor:  # ROLL's rule: a batch smaller than the divisor is copied up, never emptied (ROLL's copy)
            assert len(adjusted) == divisor
            continue
        rows = [tuple(r.tolist()) for r in adjusted.batch["input_ids"]]
        assert len(adjusted) == n - n % divisor and len(set(rows)) == len(rows), dp_size
        assert adjusted.meta_info["metrics"] == {"system/batch_add_count": 0, "system/batch_remove_count": n % divisor}
        assert played.meta_info["metrics"] == {}  # the played batch's metrics untouched
    even = played.select_idxs(np.arange(16))
    assert pipeline_object(config, 1).adjust_batch(even, mode="delete") is even  # divides: unchanged


def test_batch_adjust_copy_would_train_copies_and_count_them_in_the_statistics(config, tokenizer, scratch):
    """Why the example sets batch_adjust_mode delete: ROLL's copy mode (the example's mode before) duplicates samples
    after the returns and before the normalisation, so the copies enter the loss twice and the batch mean and std."""
    queue, manager = play_documented(config, tokenizer, "GemGuessTheNumberPython", episodes=3)
    manager.env.close()
    played = DataProto.concat(queue.rollouts)
    copy_config = documented_config(scratch)
    copy_config.batch_adjust_mode = "copy"
    batch = pipeline_step(copy_config, played, dp_size=1)
    uuids = batch.non_tensor_batch["sample_uuid"].tolist()
    assert len(set(uuids)) < len(uuids)
    played_returns = compute_discounted_returns(DataProto.concat(queue.rollouts), "step_reinforce", copy_config.step_reward_gamma).batch["step_rewards"].numpy()
    first = {u: float(v) for u, v in zip(reversed(uuids), reversed(batch.batch["response_level_rewards"].tolist()))}
    ours = roll_rebn(played_returns.astype(np.float64))
    got = [first[f"{t}_{i}"] for i, t in enumerate(played.non_tensor_batch["traj_id"])]
    assert np.abs(np.asarray(got) - ours).max() > 1e-3  # the played turns' advantages moved


# ------------------------------------------------------------------------------------------------
# Infrastructure failures: ROLL's GroupQueue with the documented group filter.
# ------------------------------------------------------------------------------------------------


def test_an_infra_failed_episode_never_reaches_the_batch_and_is_counted(config, tokenizer):
    """The python sandbox shuts down under episode 0 (at its tool call); the pool is back for the next episodes. ROLL's
    GroupQueue, with the group filter the documented config names, drops that group, opens another, and the batch it
    hands out holds only clean episodes; the count reaches the step's metrics through ROLL's reduce_metrics."""
    from roll.distributed.scheduler.rollout_scheduler import GroupQueue
    from roll.utils.functionals import append_to_dict, reduce_metrics
    from tqdm import tqdm

    from gem_core.tools.sandbox import PythonSandbox

    state = {"calls": 0}

    def shut_the_pool_once(env):
        inner = env.core
        while not hasattr(inner, "tools"):
            inner = inner.env
        tool = next(t for t in inner.tools if t.name == "python")
        state["calls"] += 1
        if state["calls"] == 1:
            tool.sandbox.close()  # the pool is shut down under this episode's tool call
            state["closed"] = tool
        elif state.get("closed") is tool:  # back for the next episode
            tool.sandbox, state["closed"] = PythonSandbox(), None

    group_filter = safe_import_class(config.train_env_manager.group_filter_cls)(config, config.train_env_manager, "train")
    group_queue = GroupQueue(group_id=0, progress_bar=tqdm(disable=True), group_size=1, group_size_redundancy=0, max_traj_per_env=None,
                             async_generation_ratio=0, group_filter=group_filter, env_monitor=None)  # fmt: skip
    group_queue.advance_step(0)
    HOOKS["before_tool_call"] = shut_the_pool_once
    try:
        queue, manager = play_documented(config, tokenizer, "GemGuessTheNumberPython", episodes=3, group_queue=group_queue)
    finally:
        HOOKS.clear()
    manager.env.close()
    failed = [r for r in queue.rollouts if r.meta_info["metrics"]["env/GemGuessTheNumberPython/infra_error"] > 0]
    assert len(queue.rollouts) == 3 and len(failed) == 1
    assert group_queue.group_filter_count == 1 and group_filter.failed_episodes == 1  # scheduler/group_filter_count

    async def two_groups():
        return [await group_queue.get(), await group_queue.get()]

    groups = asyncio.run(asyncio.wait_for(two_groups(), timeout=30))
    handed = [rollout for group in groups for rollout in group.rollouts]
    assert all(r is not failed[0] for r in handed) and len(handed) == 2
    metrics: dict = {}
    for rollout in handed:  # RolloutScheduler._get_batch_impl, then AgenticPipeline.run's reduce_metrics
        append_to_dict(metrics, rollout.meta_info["metrics"])
    reduced = reduce_metrics(metrics)
    assert reduced[METRIC] == 1.0 and reduced["env/GemGuessTheNumberPython/infra_error"] == 0.0
    batch = compute_discounted_returns(DataProto.concat(handed), config.adv_estimator, config.step_reward_gamma)
    batch, _ = compute_response_level_rewards(batch=batch, pipeline_config=config)  # the batch mean and std
    assert failed[0].non_tensor_batch["traj_id"][0] not in set(batch.non_tensor_batch["traj_id"].tolist())
    returns = batch.batch["step_rewards"].numpy().astype(np.float64)
    np.testing.assert_allclose(batch.batch["response_level_rewards"].numpy(), roll_rebn(returns), rtol=0, atol=1e-5)


class OneAnswerRouterClient:
    """ROLL's RouterClient with the engine's answer fixed: its own ``_postprocess_generate`` (the router's stop ids
    ``[eos, pad]`` and the answer's token ids and logprobs in meta_info); its request side needs an engine strategy."""

    def __init__(self, eos: int, pad: int, token_ids: list[int], logprobs: list[float]):
        from roll.distributed.scheduler.router import RouterClient

        self.client = RouterClient(proxy=None, meta={"strategy_name": "vllm", "eos_token_id": eos, "pad_token_id": pad})
        self.answer = {"output_token_ids": [token_ids], "finish_reasons": ["stop"], "output_logprobs": [logprobs]}

    def generate_request_sync(self, req, request_id, uid):
        return self.client._postprocess_generate(req, self.answer)


def proxy_answer(proxy_cls, eos: int, pad: int, prompt: list[int], token_ids: list[int], logprobs: list[float]):
    """``proxy_cls.generate`` (ROLL's PolicyProxy code) on one step manager's request, the router answering ``token_ids``:
    the response ids and the infer_logprobs the step manager keeps (make_decision: the last len(responses) of them)."""
    from roll.pipeline.agentic.llm_proxy.base_llm_proxy import BaseLLMProxy as Base
    from tensordict import TensorDict

    proxy = proxy_cls.__new__(proxy_cls)  # its __init__ asks a RouterManager for the client: set it here
    Base.__init__(proxy, None, LLMProxyConfig(proxy_type="policy"), None, None)
    proxy.router_client = OneAnswerRouterClient(eos, pad, token_ids, logprobs)
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    lm_input = DataProto(batch=TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}, batch_size=1))
    lm_input.meta_info["src_rank"] = 0
    config = {"max_new_tokens": len(token_ids), "num_return_sequences": 1}
    out = proxy.generate(messages=[], lm_input=lm_input, generation_config=config)
    responses = out.batch["responses"][0].tolist()
    return responses, out.batch["infer_logprobs"][0][-len(responses) :].tolist(), out.batch["response_mask"][0].sum().item()


@pytest.mark.parametrize("pad_is_eos", [True, False], ids=["pad is eos (SmolLM2)", "pad is not eos (Qwen)"])
def test_the_documented_proxy_keeps_the_stop_token_s_logprob_where_roll_s_takes_it_for_padding(pad_is_eos):
    """ROLL's PolicyProxy with the router's [eos, pad] stop ids: where pad == eos the response's stop token is masked as
    padding and its infer_logprob is 0 (the token still trains: the step managers keep every response token). The
    documented ``gem_core_policy`` carries the engine's logprob there and masks nothing else; with pad != eos the two agree."""
    from roll.pipeline.agentic.llm_proxy.policy_proxy import PolicyProxy as RollPolicyProxy

    from gem_integrations.roll import padding_stop_ids
    from gem_integrations.roll.llm_proxy import PolicyProxy

    eos, pad = 7, (7 if pad_is_eos else 3)
    prompt, response, logprobs = [11, 12, 13], [21, 22, eos], [-0.5, -0.25, -0.125]
    roll_ids, roll_logprobs, roll_mask = proxy_answer(RollPolicyProxy, eos, pad, prompt, response, logprobs)
    ours_ids, ours_logprobs, ours_mask = proxy_answer(PolicyProxy, eos, pad, prompt, response, logprobs)
    assert roll_ids == ours_ids == response and ours_logprobs == logprobs and ours_mask == len(response)
    if pad_is_eos:
        assert roll_logprobs == [*logprobs[:-1], 0.0] and roll_mask == len(response) - 1  # ROLL 8eb27cc as it is
        assert padding_stop_ids([eos, pad], pad) == pad
    else:
        assert roll_logprobs == ours_logprobs and roll_mask == ours_mask
        assert padding_stop_ids([eos, pad], pad) == [eos, pad]
