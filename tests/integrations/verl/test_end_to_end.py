"""End to end through verl's own rollout machinery on CPU, against the golden reference.

What runs is verl 0.9.1's: a local Ray cluster; TransferQueue (``tq.init`` with verl's own
``transfer_queue`` config); verl's global load balancer (``get_router_handle``) over one CPU server
actor; verl's ``LLMServerClient``; verl's v1 ``AgentLoopWorkerTQ`` as a Ray actor built by its real
``__init__`` (the gem_env loop comes from the plugin's ``verl.plugins`` entry point in that fresh
process); the prompts submitted as verl's sync trainer submits them; then verl's v1 trainer step
``PPOTrainer._compute_advantage`` (called, with the plugin's patch that hands rebn the turn ids) with
``algorithm.adv_estimator=rebn`` and verl's rollout correction.

The padding and infrastructure-failure tests go on through verl's own ``PPOTrainer._balance_batch``
(which pads the batch with copies of row 0 when the data-parallel size or the PPO mini-batch does not
divide it), ``_compute_old_log_prob`` (bypass mode: verl copies the rollout's logprobs) and
``_compute_advantage``.

The stand-ins, named: the server actor is :class:`verl_server.FaithfulVerlServer` (verl's vLLM server
rules over a vLLM-faithful engine playing the golden policy; no vLLM on CPU; it aborts the requests of one
episode on demand); ``old_log_probs``, which verl's actor forward pass would write, are written by the
first test (equal to the rollout's logprobs: an on-policy step; one token moved to make verl's
token-level rejection reject it); ``_balance_batch`` reads the actor worker group's data-parallel ranks
from :class:`_ActorRanks` (the worker group itself needs GPUs).
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
        server = ray.remote(num_cpus=0)(FaithfulVerlServer).remote(f"{model_dir}/tokenizer", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
        balancer = get_router_handle(servers={"cpu-server-0": server})
        client = LLMServerClient(config, load_balancer_handle=balancer)
        worker = AgentLoopWorkerTQ.options(num_cpus=0).remote(config, client)
        yield {"config": config, "server": server, "worker": worker}
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


def _submit(cluster, rows, prefix: str = "golden") -> list[str]:
    """``rows`` as verl's sync trainer submits a batch: collated, a uid each, registered in TQ; returns the
    keys verl stores their outputs under, once every agent loop finished."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    batch_dict = collate_fn(rows)
    uids = [f"{prefix}{i}" for i in range(len(rows))]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids])
    # a hang guard, not a speed check: a few seconds alone, but over 120 s once on a CI machine at load 7
    ray.get(cluster["worker"].generate_sequences.remote(batch), timeout=400)
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
    keys = _submit(cluster, golden_rows(golden))
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
        keys=keys,
        partition_id="train",
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


# ------------------------------------------------------------------------------------------------
# verl's batch padding (_balance_batch) and infrastructure failures, through verl's own trainer steps.
# ------------------------------------------------------------------------------------------------

ABORT_MARKER = "gem-infra-test: this episode's engine dies"
ABORTED_EPISODE = "gtn-default-aborted"


class _ActorRanks:
    """The one thing ``_balance_batch`` asks the actor worker group: its data-parallel ranks
    (``_dispatch_info["actor"]``, one entry per worker). The worker group itself needs GPUs."""

    def __init__(self, dp_size: int):
        self._dispatch_info = {"actor": list(range(dp_size))}


def _trainer(model_dir, *overrides: str, dp_size: int = 2):
    """verl's v1 sync trainer without its GPU set-up: what _balance_batch, _compute_old_log_prob and
    _compute_advantage read (config, tokenizer, global step, critic flag, the actor's dp ranks)."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.utils import need_critic
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = compose_verl_config(
        model_dir,
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.rollout_correction.bypass_mode=True",
        *overrides,
    )
    trainer = object.__new__(get_trainer_cls("sync"))
    trainer.config = config
    trainer.tokenizer = AutoTokenizer.from_pretrained(f"{model_dir}/tokenizer")
    trainer.global_steps = 1
    trainer.use_critic = need_critic(config)
    trainer.actor_rollout_wg = _ActorRanks(dp_size)
    return trainer


def _aborted_row(golden) -> dict:
    """A GuessTheNumber episode (gtn-default's env and seed) whose second request the server aborts: its
    system prompt carries the marker the server looks for."""
    row = dict(golden_rows(golden)[1])
    row.update(episode_id=ABORTED_EPISODE, system_prompt=ABORT_MARKER, index=len(golden.episodes))
    return row


@pytest.fixture(scope="module")
def padded_rollout(cluster, golden):
    """The golden rows and the aborted episode played once through verl's worker; returns
    (aborted key, golden keys)."""
    ray.get(cluster["server"].abort_prompts_containing.remote(ABORT_MARKER, 2))
    rows = [_aborted_row(golden), *({**row, "system_prompt": ""} for row in golden_rows(golden))]  # "": none
    keys = _submit(cluster, rows, prefix="pad")
    return keys[0], keys[1:]


def _step_to_advantage(trainer, keys, *, balance: bool):
    """verl's own steps: [_balance_batch ->] _compute_old_log_prob -> _compute_advantage; returns the
    batch (keys in verl's order, tags), the step's metrics and each key's stored advantages."""
    from transfer_queue import KVBatchMeta

    tags = tq.kv_list(partition_id="train")["train"]
    batch = KVBatchMeta(partition_id="train", keys=list(keys), tags=[dict(tags[key]) for key in keys])
    metrics: dict = {}
    if balance:
        batch = trainer._balance_batch(batch, metrics=metrics)
    batch = trainer._compute_old_log_prob(batch, metrics)
    batch = trainer._compute_advantage(batch, metrics)
    stored = _rows(batch.keys, ["advantages"])["advantages"]
    return batch, metrics, dict(zip(batch.keys, stored))


def test_verls_batch_padding_adds_nothing_to_rebn(padded_rollout, golden, model_dir):
    """7 episodes, actor dp size 2 and ppo_mini_batch_size 5: verl's _balance_batch pads the batch to 10
    with copies of row 0 (is_padding, which keep row 0's gem_turn_ids). Every real row's advantages equal
    the unpadded batch's and the golden reference; the padding rows get none."""
    _, keys = padded_rollout
    trainer = _trainer(model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=5")
    assert trainer._get_required_batch_multiple(2) == 10

    batch, metrics, padded = _step_to_advantage(trainer, keys, balance=True)
    padding = [key for key, tag in zip(batch.keys, batch.tags) if tag.get("is_padding")]
    assert len(batch.keys) == 10 and len(padding) == 3 and sorted(set(batch.keys) - set(padding)) == sorted(keys)
    # what verl's padding rows carry: row 0's turn ids, a one-token masked response
    copied = _rows(padding, ["gem_turn_ids", "response_mask"])
    first = _rows(keys[:1], ["gem_turn_ids"])["gem_turn_ids"][0]
    assert all(torch.equal(ids, first) for ids in copied["gem_turn_ids"])
    assert all(mask.tolist() == [0] for mask in copied["response_mask"])

    _, _, unpadded = _step_to_advantage(trainer, keys, balance=False)
    for key, expected in zip(keys, golden.token_advantages):
        np.testing.assert_allclose(padded[key].double().numpy(), expected, atol=1e-5)
        assert torch.equal(padded[key], unpadded[key])
    for key in padding:
        assert padded[key].abs().sum().item() == 0.0
    assert metrics["gem/padding_rows"] == 3.0 and metrics["gem/turn_ids_from_mask"] == 0.0


def test_aborted_episode_is_out_of_the_loss_and_of_rebn_and_counted(padded_rollout, golden, model_dir):
    """verl's server aborts the second request of one episode (an infrastructure failure): that row keeps
    its tokens but has response_mask 0, rm_scores 0 and turn ids -1; the other rows' advantages are the
    golden reference, as if the episode had not been played; the step's metrics count it once, although
    verl's padding copies that row (row 0) three times, and the batch's success rate leaves it and the copies out."""
    aborted, keys = padded_rollout
    stored = _rows([aborted], ["responses", "response_mask", "rm_scores", "gem_turn_ids"])
    assert len(stored["responses"][0]) > 1  # the first turn was answered and kept
    assert stored["response_mask"][0].sum().item() == 0
    assert stored["rm_scores"][0].abs().sum().item() == 0.0
    assert set(stored["gem_turn_ids"][0].tolist()) == {-1}

    trainer = _trainer(model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=5")
    batch, metrics, advantages = _step_to_advantage(trainer, [aborted, *keys], balance=True)
    assert len(batch.keys) == 10 and sum(bool(tag.get("is_padding")) for tag in batch.tags) == 2
    assert advantages[aborted].abs().sum().item() == 0.0
    for key, expected in zip(keys, golden.token_advantages):
        np.testing.assert_allclose(advantages[key].double().numpy(), expected, atol=1e-5)
    assert _rows([aborted], ["gem_infra_error"])["gem_infra_error"] == ["the engine aborted the request"]
    assert metrics["gem/infra_failed_episodes"] == 1.0
    assert metrics["gem/infra_failed_fraction"] == pytest.approx(1 / 8)
    # the batch's success rate: the golden episodes' outcomes, the aborted one and verl's padding copies left out
    assert metrics["gem/success_rate"] == pytest.approx(sum(t.success for t in golden.trajectories) / len(golden.trajectories))
