"""No env left behind by the verl plugin: verl's AgentLoopWorker plays a batch through the gem_env agent loop
(the golden rows plus two episodes the server aborts, one at its first request and one at its second), and
every env made through TaskSpec.make_env in this process is closed exactly once."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from conftest import PROMPT_LENGTH, RESPONSE_LENGTH, golden_rows


def _count_envs(monkeypatch) -> list[dict]:
    """Every env made through TaskSpec.make_env in this process, with how often it was closed."""
    from helpers.lifecycle import track_env_closes

    return track_env_closes(monkeypatch)


def _rows_and_server(model_dir, golden):
    """The golden rows plus two of gtn's episode whose requests the server aborts (at once / on turn two)."""
    from verl_server import FaithfulVerlServer, InProcessServerManager

    server = FaithfulVerlServer(f"{model_dir}/tokenizer", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    server.abort_prompts_containing("engine dies at once", 1)
    server.abort_prompts_containing("engine dies on turn two", 2)
    rows = golden_rows(golden)
    rows += [{**rows[1], "system_prompt": "engine dies at once", "episode_id": "abort-1", "index": len(rows)},
             {**rows[1], "system_prompt": "engine dies on turn two", "episode_id": "abort-2", "index": len(rows) + 1}]  # fmt: skip
    return rows, InProcessServerManager(server)


def _play_v1(verl_config, model_dir, golden, monkeypatch):
    """verl's v1 AgentLoopWorkerTQ._run_prompt over every row, concurrently; TransferQueue's puts recorded."""
    from test_agent_loop import _tq_worker_class, _worker
    from verl.trainer.ppo.v1 import agent_loop_tq

    made = _count_envs(monkeypatch)
    stored: dict[str, dict] = {}
    statuses: list[str] = []

    async def kv_batch_put(keys, fields, tags, partition_id):
        stored.update(zip(keys, fields))

    async def kv_put(key, partition_id, tag):
        statuses.append(tag["status"])

    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", list)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)
    rows, manager = _rows_and_server(model_dir, golden)
    worker = _worker(_tq_worker_class(), verl_config, None)
    worker.llm_client = manager
    worker.background_tasks = set()

    async def play():
        await asyncio.gather(*(
            worker._run_prompt({**row, "uid": f"u{i}", "global_steps": 1, "__rollout_n__": 1}, {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                               {"step": 1, "sample_index": i, "rollout_n": 0, "validate": False})
            for i, row in enumerate(rows)
        ))  # fmt: skip

    asyncio.run(play())
    return made, stored, statuses, len(rows)


def test_v1_worker_closes_every_env_it_makes_aborted_episodes_included(verl_config, model_dir, golden, monkeypatch):
    """verl's v1 worker (the one the rebn trainer uses), each row stored to TransferQueue as verl does: one
    env per row, each closed exactly once, the aborted ones too."""
    from gem_integrations.verl.advantage import INFRA_FIELD

    made, stored, statuses, n = _play_v1(verl_config, model_dir, golden, monkeypatch)
    assert statuses.count("finished") == n and "failure" not in statuses
    assert [stored[f"u{i}_0_0"][INFRA_FIELD] for i in (n - 2, n - 1)] == ["the engine aborted the request"] * 2
    assert len(made) == n, f"one env per row, got {len(made)} for {n} rows"
    assert [r["closed"] for r in made] == [1] * n, f"envs not closed exactly once: {[r for r in made if r['closed'] != 1]}"


def test_v1_rows_all_carry_the_same_fields(verl_config, model_dir, golden, monkeypatch):
    _, stored, _, n = _play_v1(verl_config, model_dir, golden, monkeypatch)
    tensors = {key: {k for k, v in field.items() if isinstance(v, torch.Tensor)} for key, field in stored.items()}
    assert tensors[f"u{n - 2}_0_0"] == tensors["u0_0_0"]


def test_legacy_worker_batches_rows_and_closes_every_env(verl_config, model_dir, golden, monkeypatch):
    """verl's AgentLoopWorker.generate_sequences over the golden rows and the episode aborted on its second
    request: one env per row, each closed exactly once."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from gem_integrations.verl.advantage import INFRA_FIELD

    made = _count_envs(monkeypatch)
    rows, manager = _rows_and_server(model_dir, golden)
    rows = rows[:-2] + rows[-1:]  # (an episode aborted at its first request: see the test below)
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    AgentLoopWorker.__init__(worker, verl_config, llm_client=manager)  # verl's own constructor
    output = asyncio.run(worker.generate_sequences(_batch(rows)))
    n = len(rows)
    assert len(output) == n and list(output.non_tensor_batch[INFRA_FIELD][-1:]) == ["the engine aborted the request"]
    assert len(made) == n and [r["closed"] for r in made] == [1] * n


def _batch(rows):
    from tensordict import TensorDict
    from verl import DataProto

    n = len(rows)
    non_tensor = {key: np.array([row.get(key) for row in rows], dtype=object) for key in rows[-1]}
    return DataProto(batch=TensorDict({"dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8)}, batch_size=n), non_tensor_batch=non_tensor)


def test_legacy_worker_batches_a_row_aborted_at_its_first_request(verl_config, model_dir, golden, monkeypatch):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    made = _count_envs(monkeypatch)
    rows, manager = _rows_and_server(model_dir, golden)
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    AgentLoopWorker.__init__(worker, verl_config, llm_client=manager)
    try:
        output = asyncio.run(worker.generate_sequences(_batch(rows)))
    finally:
        assert len(made) == len(rows) and [r["closed"] for r in made] == [1] * len(rows)  # closed even so
    assert len(output) == len(rows)
