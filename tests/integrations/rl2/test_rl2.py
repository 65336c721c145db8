"""The RL2 plugin against rl-square 0.0.2's own code: the golden scenario through RL2's rollout loop
(``Rollout.__call__``/``Rollout.rollout`` loading the env module from ``rollout.env_path``, RL2's
dataset and dataloader reading ``gem-core make-dataset rl2`` rows) and ``PPOTrainer.train``, whose
advantage step calls the patched ``compute_advantages``; RL2's other estimators bit-identical; RL2
HEAD's ``generate`` contract (as read from its source) over the same SGLang stand-in."""

from __future__ import annotations

import asyncio
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest
import torch

from gem_core.tasks import TaskSpec
from gem_core.testing.golden import GOLDEN_EPISODES, GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, golden_scenario, tool_episodes

from sglang_server import FakeSGLang  # noqa: E402  (conftest put this folder on the path via pytest's rootdir)

ATOL = 1e-6
SCENARIO = GOLDEN_EPISODES + tool_episodes()  # the Python-tool episode too


@pytest.fixture(scope="module")
def reference(tokenizer):
    assert any("python" in e.tools for e in SCENARIO), "the tool-env episode is part of the scenario"
    return golden_scenario(tokenizer=tokenizer, episodes=SCENARIO)


@pytest.fixture()
def server(tokenizer):
    server = FakeSGLang(tokenizer)
    yield server
    server.close()


def _rows(path) -> None:
    with open(path, "w") as handle:
        for e in SCENARIO:
            spec = TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS)
            handle.write(json.dumps({"extra_info": {"gem_task": spec.to_json()}}) + "\n")


def _config(tmp_path, **adv):
    from omegaconf import OmegaConf
    from RL2.trainer import ppo

    config = OmegaConf.load(os.path.join(os.path.dirname(ppo.__file__), "config", "ppo.yaml"))
    data = tmp_path / "train.jsonl"
    _rows(data)
    from gem_integrations.rl2 import env_path

    overrides = [
        f"train_data.path={data}", f"train_data.prompts_per_rollout={len(SCENARIO)}", "rollout.max_turns=100",
        f"rollout.env_path={env_path()}", f"rollout.train_sampling_params.max_new_tokens={GOLDEN_PARAMS.max_tokens}",
        "+rollout.train_sampling_params.skip_special_tokens=false", "trainer.use_wandb=false", "actor.model_name=test",
        *(f"adv.{k}={v}" if k in config.adv else f"+adv.{k}={v}" for k, v in adv.items()),
    ]
    return OmegaConf.merge(config, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))


class _Actor:
    """The PPO actor's update (an FSDP model on GPU in RL2): records the batch it is handed."""

    def __init__(self):
        self.batches = []

    def update(self, tensor_dict, step):
        self.batches.append({k: v.clone() for k, v in tensor_dict.items()})


def _run_ppo_train(config, tokenizer, server, monkeypatch):
    from omegaconf import OmegaConf
    from RL2.datasets import RLDataset, get_dataloader
    from RL2.trainer import ppo
    from RL2.workers.rollout import Rollout

    from gem_integrations.rl2 import rollout as gem_rollout

    gem_rollout.configure(tokenizer=tokenizer, params=GOLDEN_PARAMS)
    rollout = Rollout.__new__(Rollout)  # __init__ launches SGLang servers (GPU): set its fields as it would
    rollout.config = config.rollout
    rollout.prepare_device_mesh()
    rollout.prepare_environment()  # RL2's importlib load of rollout.env_path
    rollout.tokenizer = tokenizer
    rollout.router_url = rollout.worker_url = server.url
    rollout.train_sampling_params = OmegaConf.to_container(config.rollout.train_sampling_params)
    rollout.test_sampling_params = OmegaConf.to_container(config.rollout.test_sampling_params)
    rollout.update = lambda actor, step: None  # the weight sync to SGLang needs CUDA
    trainer = ppo.PPOTrainer.__new__(ppo.PPOTrainer)  # its __init__ builds FSDP actors
    trainer.config = config
    trainer.actor = _Actor()
    trainer.critic = None
    trainer.rollout = rollout
    trainer.train_dataloader = get_dataloader(RLDataset(config.train_data, tokenizer), config.train_data.prompts_per_rollout)
    monkeypatch.setattr(ppo, "save_model", lambda *args, **kwargs: None)  # saving needs the FSDP model
    loop = asyncio.new_event_loop()  # RL2 runs its rollout on asyncio.get_event_loop() of the main thread
    asyncio.set_event_loop(loop)
    try:
        trainer.train()
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert len(trainer.actor.batches) == 1
    return trainer.actor.batches[0]


def _rows_of(batch, reference):
    """For each golden episode, the row of RL2's batch holding its sequence (RL2's dataloader shuffles)."""
    out = []
    for sequence in reference.sequences:
        full = list(sequence.prompt_ids) + list(sequence.response_ids)
        found = [i for i in range(batch["states"].shape[0]) if batch["states"][i, : len(full) - 1].tolist() == full[:-1] and int(batch["eos_mask"][i].nonzero()[-1]) == len(full) - 2]
        assert found, "a golden episode's tokens are not in RL2's batch"
        out.append(found[0])
    return out


def test_golden_scenario_through_rl2_ppo_train(tokenizer, reference, server, tmp_path, monkeypatch):
    from RL2.trainer import ppo

    from gem_integrations.rl2.plugin_spec import PLUGIN

    config = _config(tmp_path, gamma=reference.gamma, rebn_ddof=reference.ddof, rebn_eps=reference.eps)
    original = ppo.compute_advantages
    PLUGIN.install()
    try:
        assert ppo.compute_advantages is not original
        batch = _run_ppo_train(config, tokenizer, server, monkeypatch)
    finally:
        assert PLUGIN.uninstall() == []
    assert ppo.compute_advantages is original
    assert all(body.get("input_ids") for path, body in server.calls if path == "/generate")
    for i, row in enumerate(_rows_of(batch, reference)):
        sequence = reference.sequences[i]
        n_prompt, n = len(sequence.prompt_ids), len(sequence.prompt_ids) + len(sequence.response_ids) - 1
        mask = [0] * (n_prompt - 1) + list(sequence.loss_mask)
        assert batch["action_mask"][row, :n].tolist() == mask
        logps = [0.0] * (n_prompt - 1) + [lp if m else 0.0 for lp, m in zip(sequence.logprobs, sequence.loss_mask)]
        assert batch["llm_logps"][row, :n].tolist() == pytest.approx(logps, abs=0)
        rewards = [0.0] * (n_prompt - 1) + sequence.token_rewards()
        assert batch["rewards"][row, :n].tolist() == pytest.approx(rewards, abs=1e-6)
        expected = [0.0] * (n_prompt - 1) + reference.token_advantages[i]
        assert batch["advantages"][row, :n].tolist() == pytest.approx(expected, abs=ATOL), reference.episodes[i].episode_id


def test_unpatched_rl2_is_bit_identical(tokenizer, reference, server, tmp_path, monkeypatch):
    """RL2's own run (no patch) and the patched function with RL2's estimators give identical tensors."""
    from RL2.utils.algorithms import compute_advantages

    from gem_integrations.rl2.advantage import make_compute_advantages

    config = _config(tmp_path, gamma=0.9)
    batch = _run_ppo_train(config, tokenizer, server, monkeypatch)  # RL2's own advantage step
    episode_level = batch["advantages"]
    patched = make_compute_advantages(compute_advantages)
    cu_seqs = torch.arange(batch["states"].shape[0] + 1)
    for estimator, extra in (("reinforce", {"rebn": False}), ("reinforce", {"rebn": False, "global_norm": True, "norm_var": True}), ("gae", {"lamda": 0.95})):
        adv = config.adv.copy()
        adv.estimator = estimator
        for k, v in extra.items():
            adv[k] = v
        ours = {k: v.clone() for k, v in batch.items() if k not in ("advantages", "returns")}
        theirs = {k: v.clone() for k, v in ours.items()}
        if estimator == "gae":
            values = torch.linspace(-1, 1, ours["states"].numel()).view_as(ours["states"].float()) * ours["action_mask"]
            ours["values"], theirs["values"] = values.clone(), values.clone()
        patched(adv, ours, cu_seqs, 1)
        compute_advantages(adv, theirs, cu_seqs, 1)
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), (estimator, key)
    ours = {k: v.clone() for k, v in batch.items() if k != "advantages"}
    compute_advantages(config.adv, ours, cu_seqs, 1)
    assert torch.equal(ours["advantages"], episode_level)


# -- RL2 HEAD's generate(config, tokenizer, router_url, sample): the contract as read from its source.


@dataclass
class HeadSample:
    """RL2 HEAD's ``RL2.datasets.rl.Sample`` fields (read at github ChenmienTan/RL2 9161ede), a stand-in:
    HEAD is not installable here."""

    class Status(Enum):
        RUNNING = "running"
        ABORTED = "aborted"
        DONE = "done"

    sample: dict = field(default_factory=dict)
    state_text: str = ""
    action_text: str = ""
    state_dict: dict = field(default_factory=dict)
    state_dicts: list = field(default_factory=list)
    turn: int = 0
    metrics: Any = field(default_factory=lambda: defaultdict(list))
    status: Status = Status.RUNNING


def test_head_generate_contract(tokenizer, reference, server):
    import aiohttp
    from omegaconf import OmegaConf

    from gem_integrations.rl2 import rollout as gem_rollout

    async def post(url, endpoint, payload):  # what HEAD's async_request does: POST JSON, read JSON
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/{endpoint}", json=payload) as response:
                return await response.json(content_type=None)

    config = OmegaConf.create({"sampling_params": {"temperature": 1.0, "max_new_tokens": GOLDEN_PARAMS.max_tokens}})
    samples = []
    for e in SCENARIO:
        spec = TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS)
        samples.append(HeadSample(sample={"extra_info": {"gem_task": spec.to_json()}}))

    async def play():
        await asyncio.gather(*(gem_rollout.generate(config, tokenizer, server.url, s, post=post) for s in samples))

    asyncio.run(play())
    for sample, sequence, trajectory in zip(samples, reference.sequences, reference.trajectories):
        assert sample.status is HeadSample.Status.DONE
        (state,) = sample.state_dicts
        assert state["states"] == list(sequence.prompt_ids) + list(sequence.response_ids)
        assert state["action_mask"] == [0] * len(sequence.prompt_ids) + list(sequence.loss_mask)
        assert state["rewards"] == [0.0] * len(sequence.prompt_ids) + sequence.token_rewards()
        assert sample.metrics["rewards"] == [pytest.approx(sum(trajectory.rewards))]
        assert sample.turn == trajectory.num_turns


def test_env_module_loads_by_path_and_exports_both_contracts():
    import importlib.util

    from gem_integrations.rl2 import env_path

    spec = importlib.util.spec_from_file_location("custom_module", env_path())  # as RL2 loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert all(asyncio.iscoroutinefunction(getattr(module, name)) for name in ("generate", "reset", "step"))


def test_plugin_version_and_launcher_overrides():
    from gem_integrations.rl2 import train
    from gem_integrations.rl2.plugin_spec import PLUGIN

    assert PLUGIN.check_version() == "0.0.2"
    args = train.overrides(["adv.estimator=reinforce", "actor.model_name=Qwen/Qwen3-0.6B"])
    assert "+rollout.train_sampling_params.skip_special_tokens=false" in args
    assert train.model_name(args) == "Qwen/Qwen3-0.6B"
