"""End to end through verl's own rollout machinery on CPU, against the golden reference.

What runs is verl 0.9.1's: a local Ray cluster; TransferQueue (``tq.init`` with verl's own
``transfer_queue`` config); verl's global load balancer (``get_router_handle``) over one CPU server
actor; verl's ``LLMServerClient``; verl's v1 ``AgentLoopWorkerTQ`` as a Ray actor built by its real
``__init__`` (the gem_env loop comes from the plugin's ``verl.plugins`` entry point in that fresh
process); the prompts submitted as verl's sync trainer submits them; then verl's v1 trainer step
``PPOTrainer._compute_advantage`` (called, with the plugin's patch that hands rebn the turn ids) with
``algorithm.adv_estimator=rebn`` and verl's rollout correction.

The stand-ins, named: the server actor is :class:`verl_server.FaithfulVerlServer` (verl's vLLM server
rules over a vLLM-faithful engine playing the golden policy; no vLLM on CPU), and ``old_log_probs``,
which verl's actor forward pass would write, are written by the test (equal to the rollout's logprobs:
an on-policy step; one token moved to make verl's token-level rejection reject it).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from conftest import PROMPT_LENGTH, RESPONSE_LENGTH, compose_verl_config, golden_rows

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def cluster(model_dir):
    """Ray, TransferQueue, the server actor, verl's load balancer and client, and an AgentLoopWorkerTQ actor."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    from verl_server import FaithfulVerlServer

    config = compose_verl_config(
        model_dir,
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "transfer_queue.enable=True",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "algorithm.rollout_correction.rollout_rs=token_k2",
        "algorithm.rollout_correction.rollout_rs_threshold=1.0",
    )
    pythonpath = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "PYTHONHASHSEED": "0"}})
    try:
        tq.init(config.transfer_queue)
        server = ray.remote(num_cpus=0)(FaithfulVerlServer).remote(
            f"{model_dir}/tokenizer", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH
        )
        balancer = get_router_handle(servers={"cpu-server-0": server})
        client = LLMServerClient(config, load_balancer_handle=balancer)
        worker = AgentLoopWorkerTQ.options(num_cpus=0).remote(config, client)
        yield {"config": config, "server": server, "worker": worker}
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


def _submit(cluster, golden) -> list[str]:
    """The golden rows as verl's sync trainer submits a batch: collated, a uid each, registered in TQ."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    rows = golden_rows(golden)
    batch_dict = collate_fn(rows)
    uids = [f"golden{i}" for i in range(len(rows))]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids])
    ray.get(cluster["worker"].generate_sequences.remote(batch), timeout=120)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        tags = tq.kv_list(partition_id="train").get("train", {})
        statuses = [tags.get(uid, {}).get("status") for uid in uids]
        if all(s in ("finished", "failure") for s in statuses):
            assert statuses == ["finished"] * len(uids), statuses
            return [f"{uid}_0_0" for uid in uids]
        time.sleep(0.2)
    raise AssertionError(f"the agent loops did not finish: {statuses}")


def _rows(keys, fields):
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
    return {name: [data[name][i] for i in range(len(keys))] for name in fields}


def _advantage_step(cluster, keys, metrics):
    """verl's own v1 advantage step on the stored rows (a trainer object without its GPU set-up)."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import get_trainer_cls

    from gem_integrations.verl.plugin_spec import TURN_IDS_PATCH

    assert TURN_IDS_PATCH.applied  # installed by the verl.plugins entry point when the trainer module loaded
    trainer_cls = get_trainer_cls("sync")
    trainer = object.__new__(trainer_cls)  # _compute_advantage reads only self.config
    trainer.config = cluster["config"]
    tags = tq.kv_list(partition_id="train")["train"]
    trainer._compute_advantage(KVBatchMeta(partition_id="train", keys=list(keys), tags=[tags[key] for key in keys]), metrics)
    return _rows(keys, ["advantages", "response_mask"])


def test_golden_scenario_through_verls_rollout_workers_and_advantage_step(cluster, golden):
    keys = _submit(cluster, golden)
    stored = _rows(keys, ["prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "gem_turn_ids"])
    for i, sequence in enumerate(golden.sequences):
        assert stored["prompts"][i].tolist() == sequence.prompt_ids
        assert stored["responses"][i].tolist() == sequence.response_ids
        assert stored["response_mask"][i].tolist() == sequence.loss_mask
        assert stored["gem_turn_ids"][i].tolist() == sequence.turn_ids
        np.testing.assert_allclose(stored["rollout_log_probs"][i].numpy(), sequence.logprobs, atol=1e-6)
        assert stored["rm_scores"][i].tolist() == pytest.approx(sequence.token_rewards(), abs=1e-6)
    calls = ray.get(cluster["server"].get_calls.remote())
    assert len(calls) == sum(len(t.turns) for t in golden.trajectories)
    assert all(call["sampling_params"]["max_tokens"] <= golden.params.max_tokens for call in calls)

    # old_log_probs as verl's actor would write them (on-policy: equal to the rollout's)
    old = torch.nested.as_nested_tensor([lp.clone() for lp in stored["rollout_log_probs"]], layout=torch.jagged)
    from tensordict import TensorDict

    tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"old_log_probs": old}, batch_size=len(keys)))
    metrics: dict = {}
    out = _advantage_step(cluster, keys, metrics)
    assert metrics["gem/turn_ids_from_mask"] == 0.0
    for i, expected in enumerate(golden.token_advantages):
        np.testing.assert_allclose(out["advantages"][i].double().numpy(), expected, atol=1e-5)
    baseline = [a.clone() for a in out["advantages"]]

    # verl's token-level rejection (rollout_rs=token_k2) rejects one token inside a turn: its mask is zeroed
    # before rebn; with the turn ids every other token's advantage is unchanged
    row = 0
    model_positions = [p for p, m in enumerate(golden.sequences[row].loss_mask) if m and golden.sequences[row].turn_ids[p] == 0]
    position = model_positions[len(model_positions) // 2]
    moved = [lp.clone() for lp in stored["rollout_log_probs"]]
    moved[row][position] += 2.0  # token_k2 = 0.5 * 2**2 = 2 > threshold 1.0
    tq.kv_batch_put(
        keys=keys, partition_id="train",
        fields=TensorDict({"old_log_probs": torch.nested.as_nested_tensor(moved, layout=torch.jagged)}, batch_size=len(keys)),
    )
    metrics = {}
    rejected = _advantage_step(cluster, keys, metrics)
    assert rejected["response_mask"][row][position] == 0 and sum(rejected["response_mask"][row].tolist()) == sum(golden.loss_masks[row]) - 1
    for i, before in enumerate(baseline):
        after = rejected["advantages"][i]
        keep = torch.ones_like(before, dtype=torch.bool)
        if i == row:
            keep[position] = False
            assert float(after[position]) == 0.0
        assert torch.equal(after[keep], before[keep])
