"""The gem_env agent loop driven through verl's real AgentLoopWorker machinery (legacy and v1/TransferQueue
workers), with verl's server-client call shape over a vLLM-faithful CPU server playing the golden policy: ids, masks, logprobs and rewards
must equal the golden scenario's, and verl's v1 advantage path must give its per-token ReBN advantages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from conftest import RESPONSE_LENGTH, faithful_server_manager, golden_rows

from gem_core.rollout.policy import episode_of
from gem_integrations.verl.advantage import TURN_IDS_FIELD


def _worker(cls, verl_config, manager):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = cls.__new__(cls)
    AgentLoopWorker.__init__(worker, verl_config, llm_client=manager)  # the real constructor (tokenizer from model.path)
    return worker


def _unpad_prompt(row_ids, row_attention):
    return row_ids[row_attention.bool()].tolist()


def test_legacy_worker_generate_sequences_reproduces_golden(verl_config, golden, model_dir):
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    assert any("python" in e.tools for e in golden.episodes), "the tool-env episode is part of the scenario"
    worker = _worker(AgentLoopWorker, verl_config, None)
    manager = faithful_server_manager(f"{model_dir}/tokenizer")
    worker.llm_client = manager
    rows = golden_rows(golden)
    n = len(rows)
    non_tensor = {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}
    batch = DataProto(batch=TensorDict({"dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8)}, batch_size=n), non_tensor_batch=non_tensor)

    output = asyncio.run(worker.generate_sequences(batch))

    prompt_width = output.batch["prompts"].shape[1]
    assert output.batch["responses"].shape == (n, RESPONSE_LENGTH)
    for i, sequence in enumerate(golden.sequences):
        attention = output.batch["attention_mask"][i]
        assert _unpad_prompt(output.batch["prompts"][i], attention[:prompt_width]) == sequence.prompt_ids
        length = int(attention[prompt_width:].sum())
        assert output.batch["responses"][i, :length].tolist() == sequence.response_ids
        assert output.batch["response_mask"][i, :length].tolist() == sequence.loss_mask
        assert int(output.batch["response_mask"][i, length:].sum()) == 0
        np.testing.assert_allclose(output.batch["rollout_log_probs"][i, :length].numpy(), sequence.logprobs, atol=1e-6)
        assert output.non_tensor_batch["turn_scores"][i] == sequence.rewards
        # the legacy worker keeps one scalar per row: the episode return on the last response token
        assert float(output.batch["rm_scores"][i].sum()) == pytest.approx(sum(sequence.rewards), abs=1e-6)
    # every turn of an episode went out under its episode id (sticky session), with the golden budget
    episode_ids = {e.episode_id for e in golden.episodes}
    assert {call["request_id"] for call in manager.calls} == episode_ids
    assert all(call["sampling_params"]["max_tokens"] <= golden.params.max_tokens for call in manager.calls)
    assert len(manager.calls) == sum(len(t.turns) for t in golden.trajectories)


def _tq_worker_class():
    from verl.trainer.ppo.v1 import agent_loop_tq

    modified = agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class
    return next(c for c in modified.__mro__ if c.__name__ == "AgentLoopWorkerTQ" and "_modify_class" not in c.__qualname__)


def test_v1_worker_stores_per_turn_rewards_and_rebn_matches_golden(verl_config, golden, model_dir, monkeypatch):
    """verl's v1 (TransferQueue) worker: our output's rows as it stores them, then verl's v1 advantage
    step on them gives the golden per-token ReBN advantages."""
    from verl import DataProto
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    stored: dict[str, dict] = {}
    statuses: list[str] = []

    def capture(fields):
        agent_loop_tq_list = list(fields)
        original_to_tensordict(agent_loop_tq_list)  # verl's own conversion must accept the rows
        return agent_loop_tq_list

    async def kv_batch_put(keys, fields, tags, partition_id):
        stored.update(zip(keys, fields))

    async def kv_put(key, partition_id, tag):
        statuses.append(tag["status"])

    original_to_tensordict = agent_loop_tq.list_of_dict_to_tensordict
    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", capture)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)

    worker = _worker(_tq_worker_class(), verl_config, None)
    worker.llm_client = faithful_server_manager(f"{model_dir}/tokenizer")
    worker.background_tasks = set()
    rows = golden_rows(golden)

    async def play():
        for i, row in enumerate(rows):
            prompt = {**row, "uid": f"u{i}", "global_steps": 1, "__rollout_n__": 1}
            trajectory = {"step": 1, "sample_index": i, "rollout_n": 0, "validate": False}
            await worker._run_prompt(prompt, {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, trajectory)

    asyncio.run(play())
    assert statuses == ["running", "finished"] * len(rows)
    keys = [f"u{i}_0_0" for i in range(len(rows))]
    assert sorted(stored) == sorted(keys)

    width = max(len(s.response_ids) for s in golden.sequences)
    rm_scores = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, (key, sequence) in enumerate(zip(keys, golden.sequences)):
        field = stored[key]
        assert field["prompts"].tolist() == sequence.prompt_ids
        assert field["responses"].tolist() == sequence.response_ids
        assert field["response_mask"].tolist() == sequence.loss_mask
        expected_scores = torch.tensor(sequence.token_rewards(), dtype=torch.float32)
        assert torch.equal(field["rm_scores"], expected_scores)  # every turn's reward, at its last token
        assert field[TURN_IDS_FIELD].tolist() == sequence.turn_ids  # explicit turns, next to response_mask
        assert field["metrics"]["generate_sequences"] > 0.0 and field["metrics"]["tool_calls"] > 0.0
        n = len(sequence.response_ids)
        rm_scores[i, :n] = field["rm_scores"]
        mask[i, :n] = field["response_mask"]

    # as verl's v1 trainer does in _compute_advantage
    data = DataProto.from_dict(tensors={"rm_scores": rm_scores, "response_mask": mask})
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(rows))], dtype=object)
    algorithm = verl_config.algorithm
    data = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam, config=algorithm
    )
    for i, expected in enumerate(golden.token_advantages):
        got = data.batch["advantages"][i, : len(expected)].double().numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert float(data.batch["advantages"][i, len(expected) :].abs().sum()) == 0.0


def test_episode_of_request_ids_is_the_sticky_key():
    assert episode_of("mm-easy/a/turn-3") == "mm-easy/a"


def _agent_loop(worker, manager):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from gem_integrations.verl.rollout import GemEnvAgentLoop

    return GemEnvAgentLoop(
        trainer_config=DictConfigWrap(worker.config),
        server_manager=manager,
        tokenizer=worker.tokenizer,
        processor=None,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data),
    )


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def test_overlong_first_prompt_is_left_truncated_like_verl_loops(model_dir, golden):
    """A first prompt over rollout.prompt_length keeps its last prompt_length tokens (verl's
    AgentLoopBase._cap_text_prompt_length) and the episode is played from it, instead of raising."""
    from conftest import compose_verl_config
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from gem_core.testing.golden import golden_formatter

    config = compose_verl_config(model_dir, "actor_rollout_ref.rollout.prompt_length=48")
    worker = _worker(AgentLoopWorker, config, None)
    manager = faithful_server_manager(f"{model_dir}/tokenizer")
    row = golden_rows(golden)[0]
    full = golden_formatter(worker.tokenizer).prompt_ids(golden.trajectories[0].initial_message)
    assert len(full) > 48

    output = asyncio.run(_agent_loop(worker, manager).run(dict(SAMPLING), **row))

    assert output.prompt_ids == full[-48:]
    assert manager.calls[0]["prompt_ids"] == full[-48:]
    assert sum(output.response_mask) > 0 and len(manager.calls) >= 1


def test_timing_metrics_are_measured(verl_config, model_dir, golden):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = _worker(AgentLoopWorker, verl_config, None)
    tool_row = next(r for r in golden_rows(golden) if r["env_tools"])
    output = asyncio.run(_agent_loop(worker, faithful_server_manager(f"{model_dir}/tokenizer")).run(dict(SAMPLING), **tool_row))
    assert output.metrics.generate_sequences > 0.0
    assert output.metrics.tool_calls > 0.0  # the env's steps, the Python tool's call included


def test_shortened_response_is_length_not_stop(model_dir):
    """verl's server lowers max_tokens to what is left of max_model_len and reports vLLM's "length" as
    "completed": the policy must still say "length" (and "stop" when a stop token ended it)."""
    from verl_server import FaithfulVerlServer, InProcessServerManager

    from gem_core.rollout import SamplingParams
    from gem_core.testing.golden import golden_formatter
    from gem_integrations.verl.rollout import VerlServerPolicy

    server = FaithfulVerlServer(f"{model_dir}/tokenizer", prompt_length=256, response_length=256)
    formatter = golden_formatter(server.engine.tokenizer)
    prompt = formatter.prompt_ids("You are playing Guess The Number. Guess the number between 1 and 20.")
    params = formatter.sampling_params(SamplingParams(max_tokens=200))
    policy = VerlServerPolicy(InProcessServerManager(server), SAMPLING)

    roomy = asyncio.run(policy.generate(prompt, params, request_id="e/turn-0"))
    assert roomy.finish_reason == "stop" and roomy.token_ids[-1] in params.stop_token_ids

    server.max_model_len = server.engine.max_model_len = len(prompt) + 3  # the server can give 3 tokens only
    short = asyncio.run(policy.generate(prompt, params, request_id="e/turn-0"))
    assert len(short.token_ids) == 3 < params.max_tokens
    assert short.finish_reason == "length"
    assert policy.generate_seconds > 0.0


def test_a_context_refusal_by_verls_server_ends_that_episode_at_the_context_limit(verl_config, model_dir, golden):
    """verl's vLLM server refuses a prompt that leaves no room in its max_model_len (a ValueError in its words,
    which reaches the loop through Ray): the episode ends as the runner's context limit, its answered turns
    kept in the row for training (not an infra failure), instead of failing the batch."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl_server import FaithfulVerlServer, InProcessServerManager

    from conftest import PROMPT_LENGTH
    from gem_integrations.verl.advantage import INFRA_FIELD

    server = FaithfulVerlServer(f"{model_dir}/tokenizer", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, max_model_len=200)
    worker = _worker(AgentLoopWorker, verl_config, None)
    row = golden_rows(golden)[1]  # its contexts: 83, 160, 208, ...: the third prompt leaves no room in 200
    assert [len(golden.trajectories[1].context_ids(t)) for t in range(3)] == [83, 160, 208]

    output = asyncio.run(_agent_loop(worker, InProcessServerManager(server)).run(dict(SAMPLING), **row))
    stored = output.as_dict()

    assert len(server.calls) == 3  # the third was refused
    assert output.extra_fields["gem_truncation_reason"] == "context_limit"
    assert stored[INFRA_FIELD] == ""
    first_two = golden.trajectories[1].turns[:2]
    assert int(stored["response_mask"].sum()) == sum(len(t.response_ids) for t in first_two)  # both answered turns train


def test_reward_model_with_rebn_is_refused(model_dir):
    """A reward model would overwrite (co-located) or skip (streaming) the per-turn rm_scores: refused with
    the reason, by the agent loop and by verl's trainer at construction (the plugin's patch)."""
    import verl.trainer.ppo.v1.trainer_base  # noqa: F401  (the plugin patches it when it is imported)
    from conftest import compose_verl_config
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.v1 import get_trainer_cls

    from gem_integrations.verl.plugin_spec import CONFIG_PATCH

    config = compose_verl_config(model_dir, "reward.reward_model.enable=True")
    worker = _worker(AgentLoopWorker, config, None)
    with pytest.raises(ValueError, match="reward_model.enable=True"):
        _agent_loop(worker, None)
    assert CONFIG_PATCH.applied
    with pytest.raises(ValueError, match="reward_model.enable=True"):
        get_trainer_cls("sync")(config)
    legacy = compose_verl_config(model_dir, "trainer.use_v1=False")
    with pytest.raises(ValueError, match="use_v1=True"):
        get_trainer_cls("sync")(legacy)


@pytest.mark.parametrize("from_call", [1, 2])
def test_aborted_episode_row_carries_no_loss_no_turns_no_reward(verl_config, model_dir, golden, from_call):
    """verl's server aborts the episode's first (or second) request: an infrastructure failure
    (Trajectory.infra_error). The row verl stores has response_mask 0, rm_scores 0 and turn ids -1 (the
    tokens of the answered turn kept), reward_score 0, and the reason in gem_infra_error."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl_server import FaithfulVerlServer, InProcessServerManager

    from conftest import PROMPT_LENGTH
    from gem_integrations.verl.advantage import INFRA_FIELD, SUCCESS_FIELD

    server = FaithfulVerlServer(f"{model_dir}/tokenizer", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    server.abort_prompts_containing("engine dies here", from_call)
    worker = _worker(AgentLoopWorker, verl_config, None)
    row = {**golden_rows(golden)[1], "system_prompt": "engine dies here"}

    output = asyncio.run(_agent_loop(worker, InProcessServerManager(server)).run(dict(SAMPLING), **row))
    stored = output.as_dict()

    assert len(server.calls) == from_call
    assert output.extra_fields["gem_truncation_reason"] == "abort"
    assert stored["response_mask"].sum().item() == 0
    assert stored["rm_scores"].abs().sum().item() == 0.0
    assert set(stored[TURN_IDS_FIELD].tolist()) == {-1}
    assert output.reward_score == 0.0
    assert stored[INFRA_FIELD] == "the engine aborted the request"
    assert stored[SUCCESS_FIELD] == 0.0
    if from_call == 2:  # the answered first turn's tokens stay in the row, masked
        first = golden.trajectories[1].turns[0].response_ids  # the policy reads only the user turns
        assert output.response_ids[: len(first)] == first and len(output.response_ids) > len(first)
    else:  # nothing was answered: one masked token
        assert output.response_ids == [worker.tokenizer.pad_token_id or 0]


def test_unfailed_row_has_no_infra_error(verl_config, model_dir, golden):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from gem_integrations.verl.advantage import INFRA_FIELD, SUCCESS_FIELD

    worker = _worker(AgentLoopWorker, verl_config, None)
    output = asyncio.run(_agent_loop(worker, faithful_server_manager(f"{model_dir}/tokenizer")).run(dict(SAMPLING), **golden_rows(golden)[0]))
    stored = output.as_dict()
    assert stored[INFRA_FIELD] == ""
    assert stored[SUCCESS_FIELD] == 1.0 and golden.trajectories[0].success  # the env's outcome, stored for gem/success_rate
    assert stored["response_mask"].tolist() == golden.sequences[0].loss_mask
    assert stored[TURN_IDS_FIELD].tolist() == golden.sequences[0].turn_ids


def test_a_row_that_stops_at_the_move_sends_the_brace_stops_to_verls_server(verl_config, model_dir, golden):
    # rollout.stop_after_box rides in the row's stop_after_box column (make-dataset verl --stop-after-box): every
    # generate call of the gem_env agent loop stops at a token holding "}" besides the end of turn; without it, not
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from gem_core.rollout.policy import closing_brace_ids

    worker = _worker(AgentLoopWorker, verl_config, None)
    braces = set(closing_brace_ids(worker.tokenizer))
    row = next(r for r in golden_rows(golden) if r["env_id"].startswith("game:GuessTheNumber"))
    for on in (True, False):
        manager = faithful_server_manager(f"{model_dir}/tokenizer")
        output = asyncio.run(_agent_loop(worker, manager).run(dict(SAMPLING), **{**row, "stop_after_box": on}))
        assert manager.calls and sum(output.response_mask) > 0
        stops = [set(call["sampling_params"].get("stop_token_ids") or ()) for call in manager.calls]
        assert all((braces <= s) if on else not (braces & s) for s in stops), (on, stops)
