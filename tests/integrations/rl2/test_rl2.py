"""The RL2 plugin against rl-square 0.0.2's own code: the golden scenario through RL2's rollout loop
(``Rollout.__call__``/``Rollout.rollout`` loading the env module from ``rollout.env_path``, RL2's
dataset and dataloader reading ``gem-core make-dataset rl2`` rows) and ``PPOTrainer.train``, whose
advantage step calls the patched ``compute_advantages``; RL2's other estimators bit-identical; RL2
HEAD's ``generate`` contract (as read from its source) over the same SGLang stand-in."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest
import torch

from gem_core.rollout import SamplingParams
from gem_core.tasks import TaskSpec
from gem_core.testing.golden import GOLDEN_EPISODES, GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, GoldenEpisode, golden_scenario, tool_episodes
from gem_integrations.rl2 import metrics as gem_metrics
from gem_integrations.rl2 import rollout as gem_rollout
from gem_integrations.rl2 import train

import readme_command  # noqa: E402  (this folder is on the path: pytest's rootdir-relative import)
from sglang_server import FakeSGLang  # noqa: E402

ATOL = 1e-6
SCENARIO = GOLDEN_EPISODES + tool_episodes()  # the Python-tool episode too
README_ROWS = 6  # CPU-sized: the README's dataset command with --n 6, all of them one batch


@pytest.fixture(scope="module")
def reference(tokenizer):
    assert any("python" in e.tools for e in SCENARIO), "the tool-env episode is part of the scenario"
    return golden_scenario(tokenizer=tokenizer, episodes=SCENARIO)


@pytest.fixture()
def server(tokenizer):
    server = FakeSGLang(tokenizer)
    yield server
    server.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The model path the README's ``actor.model_name`` is replaced by: the test tokenizer, saved (nothing is downloaded)."""
    from gem_core.testing import save_test_tokenizer

    return save_test_tokenizer(tmp_path_factory.mktemp("model"))


@pytest.fixture(autouse=True)
def fresh_env_module(monkeypatch):
    """Each test starts with the env module's settings, warnings and counters as in a new process."""
    monkeypatch.setattr(gem_rollout, "_SETTINGS", gem_rollout._Settings())
    monkeypatch.setattr(gem_rollout, "_WARNED", set())
    gem_metrics.pop()
    yield
    gem_rollout.close_episodes()  # whatever a failing test left, so the next one starts empty


class EnvCounter:
    """Every env the env module makes (``TaskSpec.make_env``) and how many times each was closed."""

    def __init__(self, monkeypatch):
        self.made: list[Any] = []
        self.closes: collections.Counter = collections.Counter()
        original = TaskSpec.make_env

        def make_env(spec):
            env = original(spec)
            close = env.close

            def counted_close():
                self.closes[id(env)] += 1
                close()

            env.close = counted_close
            self.made.append(env)
            return env

        monkeypatch.setattr(TaskSpec, "make_env", make_env)

    def unclosed(self) -> int:
        return sum(self.closes[id(env)] == 0 for env in self.made)

    def closed_twice(self) -> int:
        return sum(self.closes[id(env)] > 1 for env in self.made)


class WandbLog:
    """RL2's ``wandb.log`` calls (RL2 logs every metric through it)."""

    def __init__(self, monkeypatch):
        import wandb

        self.calls: list[tuple[dict, Any]] = []
        monkeypatch.setattr(wandb, "log", lambda data, step=None, **kw: self.calls.append((dict(data), step)))

    def values(self, key: str) -> list:
        return [data[key] for data, _ in self.calls if key in data]


def _descendants() -> set[int]:
    """Live processes under this one (sandbox workers, bwrap), from /proc."""
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(fields[1])].append(int(entry))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _rows(path, episodes=SCENARIO, **spec_fields) -> None:
    with open(path, "w") as handle:
        for e in episodes:
            spec = TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, **spec_fields)
            handle.write(json.dumps({"extra_info": {"gem_task": spec.to_json()}}) + "\n")


def compose_rl2(argv: list[str]):
    """RL2's own PPO config (the installed rl-square's ``ppo.yaml``) with ``argv``, composed by hydra as
    RL2's ``@hydra.main`` does."""
    from hydra import compose, initialize_config_dir
    from RL2.trainer import ppo

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(ppo.__file__), "config"), version_base=None):
        return compose(config_name="ppo", overrides=list(argv))


#: hydra settings for in-process runs only: no output directory, and pytest keeps the logging handlers
HYDRA_IN_PROCESS = ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def launch(args: list[str], run, monkeypatch):
    """The launcher (``train.main``) with ``args``: hydra composes RL2's own config from the overrides
    the launcher hands RL2's hydra ``main``, whose task (PPO start-up on GPU) is replaced by
    ``run(config)``. The ReBN patch the launcher installs is taken out after."""
    from RL2.trainer import ppo

    from gem_integrations.rl2.plugin_spec import PLUGIN

    out = {}

    def task(config):
        out["result"] = run(config)

    def rl2_main():
        raise AssertionError("the launcher must run RL2's hydra task with RL2's config directory, not ppo.main()")

    rl2_main.__wrapped__ = task  # what hydra.main's decorator keeps of RL2's task
    monkeypatch.setattr(ppo, "main", rl2_main)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv(gem_rollout.TOKENIZER_ENV, "")  # the launcher sets it from actor.model_name
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    try:
        assert train.main([*args, *HYDRA_IN_PROCESS]) == 0
    finally:
        assert PLUGIN.uninstall() == []
    return out["result"]


def readme_dataset(tmp_path, monkeypatch, n: int = README_ROWS) -> list[TaskSpec]:
    """The README's ``gem-core make-dataset rl2`` commands (``--n`` CPU-sized: ``n`` training rows, 2
    test rows), run in ``tmp_path``; returns the training rows' specs."""
    from gem_core.cli import main

    monkeypatch.chdir(tmp_path)
    for out in readme_command.dataset_outputs():
        assert main(readme_command.make_dataset_args(out=out, n=str(n if out == "train.jsonl" else 2))) == 0
    with open("train.jsonl") as handle:
        return [gem_rollout.task_spec(json.loads(line)) for line in handle]


def readme_reference(tokenizer, specs: list[TaskSpec], max_tokens: int):
    """The core runner's episodes for the README rows, over the same scripted model as the SGLang stand-in."""
    episodes = tuple(GoldenEpisode(s.env_id, s.seed, f"row{i}", f"row{i}", s.env_kwargs, s.tools) for i, s in enumerate(specs))
    return golden_scenario(tokenizer=tokenizer, episodes=episodes, params=SamplingParams(max_tokens=max_tokens, temperature=1.0), max_context_tokens=1 << 20)


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


def _rows_of(batch, sequences, exclude=()):
    """For each sequence, a row of RL2's batch holding it, each row used once (RL2's dataloader shuffles;
    two rows may play the same game)."""
    out = []
    for sequence in sequences:
        full = list(sequence.prompt_ids) + list(sequence.response_ids)
        found = [
            i for i in range(batch["states"].shape[0])
            if i not in out and i not in exclude and batch["states"][i, : len(full) - 1].tolist() == full[:-1] and int(batch["eos_mask"][i].nonzero()[-1]) == len(full) - 2
        ]  # fmt: skip
        assert found, "an episode's tokens are not in RL2's batch"
        out.append(found[0])
    return out


def _turns(row_mask) -> int:
    """Turns in one row of RL2's batch: runs of its action mask."""
    mask = [0, *[int(m) for m in row_mask]]
    return sum(1 for a, b in zip(mask, mask[1:]) if b and not a)


def _golden_args(tmp_path, model_dir, reference, **replace) -> list[str]:
    """The README's launcher overrides with the golden scenario's rows, batch and ReBN settings."""
    data = tmp_path / "golden.jsonl"
    _rows(data, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS)
    return readme_command.launcher_args(
        train_data__path=str(data),
        train_data__prompts_per_rollout=str(len(SCENARIO)),
        actor__model_name=model_dir,
        rollout__train_sampling_params__max_new_tokens=str(GOLDEN_PARAMS.max_tokens),
        adv__gamma=str(reference.gamma),
        **replace,
    ) + [f"+adv.rebn_ddof={reference.ddof}", f"+adv.rebn_eps={reference.eps}"]


def test_golden_scenario_through_rl2_ppo_train(tokenizer, reference, server, model_dir, tmp_path, monkeypatch):
    """The golden scenario from the README's command (the launcher, RL2's own config) through RL2's
    rollout and PPOTrainer.train: tokens, masks, logprobs, rewards and ReBN advantages are the
    reference's; afterwards no episode is pending, every env was closed once, no sandbox process is left."""
    from RL2.trainer import ppo

    original = ppo.compute_advantages
    envs = EnvCounter(monkeypatch)
    before = _descendants()

    def run(config):
        assert ppo.compute_advantages is not original  # the launcher installed ReBN
        return _run_ppo_train(config, tokenizer, server, monkeypatch)

    batch = launch(_golden_args(tmp_path, model_dir, reference), run, monkeypatch)
    assert ppo.compute_advantages is original
    assert all(body.get("input_ids") for path, body in server.calls if path == "/generate")
    for i, row in enumerate(_rows_of(batch, reference.sequences)):
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
    assert gem_rollout.pending_episodes() == 0
    assert (len(envs.made), envs.unclosed(), envs.closed_twice()) == (len(SCENARIO), 0, 0)
    assert _descendants() - before == set(), "a sandbox process outlived its episode"


def test_unpatched_rl2_is_bit_identical(tokenizer, reference, server, model_dir, tmp_path, monkeypatch):
    """RL2's own run (no patch) and the patched function with RL2's estimators give identical tensors."""
    from omegaconf import OmegaConf
    from RL2.utils.algorithms import compute_advantages

    from gem_integrations.rl2.advantage import make_compute_advantages

    monkeypatch.setenv(gem_rollout.TOKENIZER_ENV, model_dir)
    config = compose_rl2(train.overrides(_golden_args(tmp_path, model_dir, reference)))
    batch = _run_ppo_train(config, tokenizer, server, monkeypatch)  # RL2's own advantage step
    episode_level = batch["advantages"]
    patched = make_compute_advantages(compute_advantages)
    cu_seqs = torch.arange(batch["states"].shape[0] + 1)
    for estimator, extra in (("reinforce", {"rebn": False}), ("reinforce", {"rebn": False, "global_norm": True, "norm_var": True}), ("gae", {"lamda": 0.95})):
        adv = config.adv.copy()
        OmegaConf.set_struct(adv, False)  # hydra's config is closed to new keys
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


# -- rollout.max_turns from RL2's default config and the README's command (rl-square 0.0.2 stops there).


def _readme_run(tokenizer, server, model_dir, tmp_path, monkeypatch, extra=(), envs=None):
    """The README's dataset and launcher command (CPU-sized: ``--n``/``prompts_per_rollout`` 6, the
    local model) through RL2's rollout and PPOTrainer.train; returns the specs, the batch, the envs made
    and RL2's wandb log."""
    specs = readme_dataset(tmp_path, monkeypatch)
    args = readme_command.launcher_args(train_data__prompts_per_rollout=str(len(specs)), actor__model_name=model_dir) + list(extra)
    envs = envs or EnvCounter(monkeypatch)
    log = WandbLog(monkeypatch)
    batch = launch(args, lambda config: _run_ppo_train(config, tokenizer, server, monkeypatch), monkeypatch)
    return specs, batch, envs, log


def _readme_max_new_tokens() -> int:
    return int(train.given(readme_command.launcher_args())["rollout.train_sampling_params.max_new_tokens"])


def test_readme_config_trains_every_turn_and_closes_every_episode(tokenizer, server, model_dir, tmp_path, monkeypatch):
    """RL2 0.0.2's own default is rollout.max_turns=1 and the README's command does not set it: the
    launcher does, so every episode is trained with all its turns; afterwards no episode is pending and
    every env was closed exactly once."""
    from RL2.trainer import ppo

    assert compose_rl2([]).rollout.max_turns == 1, "RL2's own default (the reason for the launcher's value)"
    specs, batch, envs, log = _readme_run(tokenizer, server, model_dir, tmp_path, monkeypatch)
    reference = readme_reference(tokenizer, specs, _readme_max_new_tokens())
    expected = [t.num_turns for t in reference.trajectories]
    assert max(expected) > 1, "the README's env must have multi-turn episodes here, or this test shows nothing"
    assert sorted(_turns(row) for row in batch["action_mask"]) == sorted(expected)
    for i, row in enumerate(_rows_of(batch, reference.sequences)):
        n_prompt = len(reference.sequences[i].prompt_ids)
        n = n_prompt + len(reference.sequences[i].response_ids) - 1
        assert batch["advantages"][row, :n].tolist() == pytest.approx([0.0] * (n_prompt - 1) + reference.token_advantages[i], abs=ATOL)
    assert gem_rollout.pending_episodes() == 0
    assert (len(envs.made), envs.unclosed(), envs.closed_twice()) == (len(specs), 0, 0)
    assert log.values(gem_metrics.ABANDONED) == [0.0] and log.values(gem_metrics.INFRA_FAILED) == [0.0]
    successes = [t.success for t in reference.trajectories]  # the README's episodes all succeed; the golden ones (HEAD's test) do not
    assert log.values(gem_metrics.FINISHED) == [float(len(specs))] and log.values(gem_metrics.SUCCEEDED) == [float(sum(successes))]
    assert log.values(gem_metrics.SUCCESS_RATE) == [pytest.approx(sum(successes) / len(successes))]
    assert ppo.compute_advantages.__module__ == "RL2.utils.algorithms"


def test_explicit_max_turns_is_kept_warned_and_what_rl2_stops_is_closed(tokenizer, server, model_dir, tmp_path, monkeypatch, capsys, caplog):
    """A user's rollout.max_turns below the envs' turn limit is kept (RL2 trains those episodes cut
    there), warned about in one line by the launcher; the episodes RL2 abandons are closed and counted."""
    specs, batch, envs, log = _readme_run(tokenizer, server, model_dir, tmp_path, monkeypatch, extra=["rollout.max_turns=2"])
    reference = readme_reference(tokenizer, specs, _readme_max_new_tokens())
    expected = [t.num_turns for t in reference.trajectories]
    stopped = sum(n > 2 for n in expected)
    assert stopped > 0, "some episode must need more than 2 turns here, or this test shows nothing"
    warning = [line for line in capsys.readouterr().err.splitlines() if "rollout.max_turns" in line]
    assert len(warning) == 1 and "rollout.max_turns=2 is below the dataset's turn limit (4)" in warning[0], warning
    assert sorted(_turns(row) for row in batch["action_mask"]) == sorted(min(n, 2) for n in expected)
    assert gem_rollout.pending_episodes() == 0
    assert (len(envs.made), envs.unclosed(), envs.closed_twice()) == (len(specs), 0, 0)
    assert log.values(gem_metrics.ABANDONED) == [float(stopped)]
    assert log.values(gem_metrics.FINISHED) == [float(len(specs) - stopped)]  # an abandoned episode has no outcome
    assert sum("RL2 stopped a GEM episode" in r.getMessage() for r in caplog.records) == 1  # warned once


@pytest.mark.parametrize("value", ["0", "-3", "two", "1.5", ""])
def test_bad_max_turns_is_refused_in_one_line(value, model_dir, monkeypatch, capsys):
    from RL2.trainer import ppo

    def rl2_main():
        raise AssertionError("RL2 started with a bad rollout.max_turns")

    rl2_main.__wrapped__ = lambda config: rl2_main()
    monkeypatch.setattr(ppo, "main", rl2_main)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    args = readme_command.launcher_args(actor__model_name=model_dir) + [f"rollout.max_turns={value}"]
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gem-core rl2 train: error: rollout.max_turns must be an integer >= 1, got {value!r}"]


def test_launcher_max_turns_default_and_rl2_head():
    """Where RL2's config has rollout.max_turns (0.0.2) the launcher sets it unless given; RL2 HEAD has no
    such key (its generate plays whole episodes) and gets none."""
    assert train.rl2_has_max_turns()
    assert "rollout.max_turns=1000" in train.overrides(["adv.estimator=reinforce"])
    assert "rollout.max_turns=7" in train.overrides(["rollout.max_turns=7"]) and not any(
        a == "rollout.max_turns=1000" for a in train.overrides(["rollout.max_turns=7"])
    )
    assert not any(a.startswith("rollout.max_turns") for a in train.overrides(["adv.estimator=reinforce"], max_turns=False))


def test_dataset_turn_limit_reads_rows_and_registered_defaults(tmp_path):
    path = tmp_path / "rows.jsonl"
    _rows(path, episodes=GOLDEN_EPISODES[:1])  # GuessTheNumber easy: registered max_turns=4
    assert train.dataset_turn_limit(str(path)) == 4
    _rows(path, episodes=GOLDEN_EPISODES[:1], max_turns=1500)
    assert train.dataset_turn_limit(f"train@{path}") == 1500
    assert train.overrides([f"train_data.path={path}"], max_turns=True)[-1] == "rollout.max_turns=1500"
    assert train.dataset_turn_limit("some/hub-dataset") is None


# -- infrastructure failures: out of the loss and out of ReBN's statistics, counted.


class _InfraFailure:
    """Wraps one env so that its ``at``-th step reports an infrastructure failure in ``info``."""

    def __init__(self, monkeypatch, seed: int, at: int = 2):
        from gem_core.core import Wrapper
        from gem_core.errors import INFRA_ERROR

        original = TaskSpec.make_env

        class Failing(Wrapper):
            steps = 0

            def step(self, action):
                obs, reward, terminated, truncated, info = self.env.step(action)
                self.steps += 1
                if self.steps == at:
                    return obs, 0.5, False, False, {**info, INFRA_ERROR: "sandbox worker died"}
                return obs, reward, terminated, truncated, info

        def make_env(spec):
            env = original(spec)
            return Failing(env) if spec.seed == seed else env

        monkeypatch.setattr(TaskSpec, "make_env", make_env)


def test_infra_failed_episode_is_out_of_the_loss_and_of_rebn_0_0_2(tokenizer, server, model_dir, tmp_path, monkeypatch):
    """rl-square 0.0.2: an episode whose env step reports ``info["infra_error"]`` reaches RL2's actor
    with no action token, no reward and no advantage; ReBN's statistics are the other episodes'; the
    trainer's metrics count it."""
    specs = readme_dataset(tmp_path, monkeypatch)
    reference = readme_reference(tokenizer, specs, _readme_max_new_tokens())
    failing = next(i for i, t in enumerate(reference.trajectories) if t.num_turns >= 2)
    _InfraFailure(monkeypatch, specs[failing].seed, at=2)
    envs = EnvCounter(monkeypatch)
    _, batch, _, log = _readme_run(tokenizer, server, model_dir, tmp_path, monkeypatch, envs=envs)
    kept = [i for i in range(len(specs)) if i != failing]
    others = readme_reference(tokenizer, [specs[i] for i in kept], _readme_max_new_tokens())  # ReBN over these alone
    empty = [r for r in range(batch["states"].shape[0]) if int(batch["action_mask"][r].sum()) == 0]
    assert len(empty) == 1, f"rows without an action token: {empty}; expected the infra-failed episode's alone"
    (failed_row,) = empty
    rows = _rows_of(batch, others.sequences, exclude=empty)
    assert torch.count_nonzero(batch["rewards"][failed_row]) == 0 and torch.count_nonzero(batch["advantages"][failed_row]) == 0
    assert all(torch.isfinite(batch[k]).all() for k in ("rewards", "advantages"))
    for i, row in enumerate(rows):
        n_prompt = len(others.sequences[i].prompt_ids)
        n = n_prompt + len(others.sequences[i].response_ids) - 1
        assert batch["advantages"][row, :n].tolist() == pytest.approx([0.0] * (n_prompt - 1) + others.token_advantages[i], abs=ATOL)
    assert log.values(gem_metrics.INFRA_FAILED) == [1.0]
    # the batch's success rate: the episodes that ended, the infra-failed one left out
    assert log.values(gem_metrics.FINISHED) == [float(len(kept))]
    assert log.values(gem_metrics.SUCCESS_RATE) == [pytest.approx(sum(t.success for t in others.trajectories) / len(kept))]
    assert gem_rollout.pending_episodes() == 0 and envs.unclosed() == 0


def test_infra_failure_without_the_launcher_is_not_a_nan(tokenizer, model_dir, monkeypatch, caplog):
    """Without the launcher's advantage step nothing would mask the marker: the env module answers 0.0
    and warns, so RL2 never trains on a NaN."""
    from gem_integrations.rl2.plugin_spec import PLUGIN

    assert not PLUGIN.is_installed
    monkeypatch.setenv(gem_rollout.TOKENIZER_ENV, model_dir)
    spec = TaskSpec("game:GuessTheNumber-v0-easy", seed=0)
    _InfraFailure(monkeypatch, 0, at=1)

    async def play():
        state, extra = await gem_rollout.reset({"gem_task": spec.to_json()})
        return await gem_rollout.step(state, "\\boxed{5}<|im_end|>", extra)

    answer = asyncio.run(play())
    assert answer["done"] and answer["reward"] == 0.0
    assert gem_metrics.peek()[gem_metrics.INFRA_FAILED] == 1
    assert any("cannot be kept out of the loss" in r.getMessage() for r in caplog.records)


def test_0_0_2_long_responses_are_stepped_not_cut(tokenizer, model_dir, monkeypatch):
    """rl-square 0.0.2 caps each response itself (SGLang's max_new_tokens, e.g. 4096 for a reasoning
    model): the env module must step the env with a response longer than its own default cap, not end
    the episode there as if the context were full (reward 0, the env never told)."""
    monkeypatch.setenv(gem_rollout.TOKENIZER_ENV, model_dir)
    spec = TaskSpec("game:GuessTheNumber-v0-easy", seed=0)
    action = "let me think about it. " * 400 + "\\boxed{5}<|im_end|>"
    assert len(tokenizer.encode(action, add_special_tokens=False)) > gem_rollout.DEFAULT_MAX_TOKENS

    async def play():
        state, extra = await gem_rollout.reset({"gem_task": spec.to_json()})
        answer = await gem_rollout.step(state, action, extra)
        gem_rollout.close_episodes()
        return state, answer

    state, answer = asyncio.run(play())
    assert answer["next_state"].startswith(state + action) and "you guessed 5" in answer["next_state"][len(state + action) :]


def test_marked_rows_never_reach_rl2_estimators(tokenizer):
    """The 0.0.2 marker (NaN reward) is turned into a masked trajectory before RL2's own estimators run:
    their advantages stay finite and are 0 on it; ReBN with per-prompt groups skips it."""
    from RL2.utils.algorithms import compute_advantages
    from omegaconf import OmegaConf

    from gem_integrations.rl2.advantage import make_compute_advantages

    def batch():
        mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0], [0, 1, 0, 1, 1], [0, 1, 1, 0, 0]])
        rewards = torch.zeros(mask.shape)
        rewards[0, 2], rewards[0, 4], rewards[1, 3], rewards[2, 1], rewards[2, 4], rewards[3, 2] = 0.5, 1.0, gem_metrics.INFRA_REWARD, 0.2, 0.0, 1.0
        return {
            "states": torch.ones(mask.shape, dtype=torch.long),
            "actions": mask.clone(),
            "action_mask": mask,
            "rewards": rewards,
            "eos_mask": torch.zeros(mask.shape, dtype=torch.long),
        }

    patched = make_compute_advantages(compute_advantages)
    cu_seqs = torch.arange(5)
    for adv in (
        {"estimator": "reinforce", "rebn": False, "responses_per_prompt": 2, "global_norm": False, "norm_var": True, "gamma": 1.0},
        {"estimator": "gae", "gamma": 1.0, "lamda": 0.95, "responses_per_prompt": 2},
        {"estimator": "reinforce", "rebn_group_by": "prompt", "responses_per_prompt": 2, "gamma": 0.9, "global_norm": False, "norm_var": False},
    ):
        data = batch()
        if adv["estimator"] == "gae":
            data["values"] = torch.full(data["states"].shape, 0.1) * data["action_mask"]
        patched(OmegaConf.create(adv), data, cu_seqs, 1)
        assert torch.isfinite(data["advantages"]).all(), adv
        assert int(data["action_mask"][1].sum()) == 0 and torch.count_nonzero(data["advantages"][1]) == 0, adv


def _two_prompt_batch(failed_marker: bool = True):
    """Two prompts of 4 trajectories (one row each): prompt 0's three solved episodes and one the
    infrastructure failed (0.0.2's NaN reward marker), prompt 1's three played (rewards 1, 0, 0.5) and one
    failed. ``failed_marker=False``: the 6 played trajectories alone (prompts of 3)."""
    rows = list(zip([3, 4, 2, 3, 4, 2, 3, 3], [1.0, 1.0, 1.0, None, 1.0, 0.0, None, 0.5]))
    if not failed_marker:
        rows = [row for row in rows if row[1] is not None]
    lengths, rewards_of = [n for n, _ in rows], [r for _, r in rows]
    mask = torch.zeros(len(rewards_of), 6, dtype=torch.long)
    rewards = torch.zeros(mask.shape)
    for row, (n, reward) in enumerate(zip(lengths, rewards_of)):
        mask[row, 1 : 1 + n] = 1
        rewards[row, n] = gem_metrics.INFRA_REWARD if reward is None else reward
    return {
        "states": torch.ones(mask.shape, dtype=torch.long),
        "actions": mask.clone(),
        "action_mask": mask,
        "rewards": rewards,
        "eos_mask": torch.zeros(mask.shape, dtype=torch.long),
    }


@pytest.mark.parametrize(("global_norm", "norm_var"), [(False, False), (False, True), (True, False), (True, True)])
def test_infra_failed_trajectories_enter_no_reinforce_baseline(global_norm, norm_var):
    """RL2's own REINFORCE (``+adv.rebn=false``) through RL2.trainer.ppo.compute_advantages as the plugin
    patches it: every played trajectory gets what RL2 gives the 6 played ones alone as prompts of 3
    (prompt 0's solved episodes: 0, not +0.25 or +0.5 from the dead sandbox's 0), the failed ones 0."""
    from omegaconf import OmegaConf
    from RL2.trainer import ppo
    from RL2.utils.algorithms import compute_advantages as rl2s_own

    from gem_integrations.rl2.plugin_spec import PLUGIN

    adv = {"estimator": "reinforce", "rebn": False, "global_norm": global_norm, "norm_var": norm_var, "gamma": 1.0}
    PLUGIN.install()
    try:
        data = _two_prompt_batch()
        ppo.compute_advantages(OmegaConf.create({**adv, "responses_per_prompt": 4}), data, torch.arange(9), 1)
    finally:
        assert PLUGIN.uninstall() == []
    expected = _two_prompt_batch(failed_marker=False)
    rl2s_own(OmegaConf.create({**adv, "responses_per_prompt": 3}), expected, torch.arange(7), 1)
    played = [0, 1, 2, 4, 5, 7]
    assert torch.count_nonzero(data["advantages"][[3, 6]]) == 0 and int(data["action_mask"][[3, 6]].sum()) == 0
    torch.testing.assert_close(data["advantages"][played], expected["advantages"], rtol=1e-6, atol=1e-6)
    if not global_norm:
        assert torch.count_nonzero(data["advantages"][:3]) == 0


def test_a_prompt_left_with_one_played_trajectory_gets_no_advantage():
    """RL2's std of one value is NaN: a group whose other trajectories failed gets 0, finite."""
    from omegaconf import OmegaConf
    from RL2.trainer import ppo

    from gem_integrations.rl2.plugin_spec import PLUGIN

    PLUGIN.install()
    try:
        data = _two_prompt_batch()
        adv = {"estimator": "reinforce", "rebn": False, "global_norm": False, "norm_var": True, "gamma": 1.0, "responses_per_prompt": 2}
        ppo.compute_advantages(OmegaConf.create(adv), data, torch.arange(9), 1)  # prompts of 2: (2, 3) and (6, 7) keep one
    finally:
        assert PLUGIN.uninstall() == []
    assert torch.isfinite(data["advantages"]).all()
    assert torch.count_nonzero(data["advantages"][[2, 3, 6, 7]]) == 0 and torch.count_nonzero(data["advantages"][[4, 5]]) > 0


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


async def _head_post(url, endpoint, payload):  # what HEAD's async_request does: POST JSON, read JSON
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/{endpoint}", json=payload) as response:
            return await response.json(content_type=None)


def _head_config():
    from omegaconf import OmegaConf

    return OmegaConf.create({"sampling_params": {"temperature": 1.0, "max_new_tokens": GOLDEN_PARAMS.max_tokens}})


def _head_samples(episodes=SCENARIO) -> list[HeadSample]:
    samples = []
    for e in episodes:
        spec = TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS)
        samples.append(HeadSample(sample={"extra_info": {"gem_task": spec.to_json()}}))
    return samples


def test_head_generate_contract(tokenizer, reference, server):
    post, config, samples = _head_post, _head_config(), _head_samples()

    async def play():
        await asyncio.gather(*(gem_rollout.generate(config, tokenizer, server.url, s, post=post) for s in samples))

    gem_metrics.pop()
    asyncio.run(play())
    counts = gem_metrics.pop()  # every episode ended: the batch's success rate is theirs
    successes = [t.success for t in reference.trajectories]
    assert counts[gem_metrics.FINISHED] == len(samples) and counts[gem_metrics.SUCCESS_RATE] == pytest.approx(sum(successes) / len(successes))
    for sample, sequence, trajectory in zip(samples, reference.sequences, reference.trajectories):
        assert sample.status is HeadSample.Status.DONE
        (state,) = sample.state_dicts
        assert state["states"] == list(sequence.prompt_ids) + list(sequence.response_ids)
        assert state["action_mask"] == [0] * len(sequence.prompt_ids) + list(sequence.loss_mask)
        assert state["rewards"] == [0.0] * len(sequence.prompt_ids) + sequence.token_rewards()
        assert sample.metrics["rewards"] == [pytest.approx(sum(trajectory.rewards))]
        assert sample.turn == trajectory.num_turns


def test_head_generate_a_context_refusal_ends_that_episode_alone(tokenizer):
    """SGLang refuses an input that leaves no room in its context (a 400 with its message): that episode ends
    as the runner's context limit (truncated, its turns kept for training, not an infra failure); the
    episodes beside it play on."""
    server = FakeSGLang(tokenizer, max_model_len=150)
    samples = _head_samples([GOLDEN_EPISODES[0], GOLDEN_EPISODES[2]])  # contexts 83, 128, 173, ...; and 84 (one turn)
    try:

        async def play():
            await asyncio.gather(*(gem_rollout.generate(_head_config(), tokenizer, server.url, s, post=_head_post) for s in samples))

        asyncio.run(play())
    finally:
        server.close()
    refused = [body for path, body in server.calls if len(body["input_ids"]) >= 150]
    assert len(refused) == 1  # the third prompt of the first episode
    assert [s.turn for s in samples] == [2, 1] and all(s.status is HeadSample.Status.DONE for s in samples)
    (state,) = samples[0].state_dicts
    assert sum(state["action_mask"]) > 0  # a context-limit ending is trained on, unlike an infra failure
    assert state["states"] == refused[0]["input_ids"]  # the two turns and the last message, nothing after the refusal


def test_head_generate_closes_its_env_when_cancelled(tokenizer, server, monkeypatch):
    """RL2 HEAD cancels a sample's ``generate`` (a failed rollout, the end of the run): its env is closed."""
    envs = EnvCounter(monkeypatch)
    started = asyncio.Event()
    calls = []

    async def post(url, endpoint, payload):
        calls.append(payload)
        if len(calls) == 2:  # the second turn's request never comes back
            started.set()
            await asyncio.Event().wait()
        return await _head_post(url, endpoint, payload)

    (sample,) = _head_samples(GOLDEN_EPISODES[:1])

    async def play():
        task = asyncio.ensure_future(gem_rollout.generate(_head_config(), tokenizer, server.url, sample, post=post))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(play())
    assert (len(envs.made), envs.unclosed()) == (1, 0)


def test_head_infra_failed_episodes_carry_no_action_and_are_counted(tokenizer, server, monkeypatch):
    """RL2 HEAD: an episode whose request the engine aborted, and one whose env step reports
    ``info["infra_error"]``, are written with no action token and no reward (out of RL2's loss and of
    ReBN) and counted; the others are untouched."""
    from gem_integrations.rl2.advantage import rebn_advantages

    episodes = (GOLDEN_EPISODES[0], GOLDEN_EPISODES[1], GOLDEN_EPISODES[3])  # gtn-easy, gtn-default, mm-easy/a
    samples, clean = _head_samples(episodes), _head_samples(episodes)

    def aborting_second_request():
        count = 0

        async def post(url, endpoint, payload):
            nonlocal count
            count += 1
            answer = await _head_post(url, endpoint, payload)
            if count == 2:
                answer["meta_info"]["finish_reason"] = {"type": "abort"}
            return answer

        return post

    async def play(batch, posts):
        await asyncio.gather(*(gem_rollout.generate(_head_config(), tokenizer, server.url, s, post=p) for s, p in zip(batch, posts)))

    asyncio.run(play(clean, [_head_post] * 3))
    gem_metrics.pop()
    _InfraFailure(monkeypatch, GOLDEN_EPISODES[1].seed, at=1)  # gtn-default: its first step fails
    asyncio.run(play(samples, [aborting_second_request(), _head_post, _head_post]))  # gtn-easy: its second request aborted
    assert clean[0].turn >= 2, "gtn-easy must have a second turn to abort"
    for i in (0, 1):
        (state,) = samples[i].state_dicts
        assert sum(state["action_mask"]) == 0 and not any(state["rewards"]) and samples[i].status is HeadSample.Status.DONE
    assert samples[2].state_dicts == clean[2].state_dicts
    assert gem_metrics.peek()[gem_metrics.INFRA_FAILED] == 2
    assert gem_metrics.peek()[gem_metrics.FINISHED] == 1  # the failed two have no outcome
    tensors = {
        k: torch.nn.utils.rnn.pad_sequence([torch.tensor(s.state_dicts[0][k], dtype=torch.float64) for s in samples], batch_first=True)
        for k in ("states", "action_mask", "rewards")
    }
    advantages = rebn_advantages(tensors, torch.arange(4), gamma=0.9)
    assert torch.count_nonzero(advantages[:2]) == 0 and torch.count_nonzero(advantages[2]) > 0


def test_env_module_loads_by_path_and_exports_both_contracts():
    import importlib.util

    from gem_integrations.rl2 import env_path

    spec = importlib.util.spec_from_file_location("custom_module", env_path())  # as RL2 loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert all(asyncio.iscoroutinefunction(getattr(module, name)) for name in ("generate", "reset", "step"))


def test_plugin_version_and_launcher_overrides():
    from gem_integrations.rl2.plugin_spec import PLUGIN

    assert PLUGIN.check_version() == "0.0.2"
    args = train.overrides(["adv.estimator=reinforce", "actor.model_name=Qwen/Qwen3-0.6B"])
    assert "+rollout.train_sampling_params.skip_special_tokens=false" in args
    assert train.model_name(args) == "Qwen/Qwen3-0.6B"


def test_head_generate_a_row_that_stops_at_the_move_sends_the_brace_stops(tokenizer):
    # rollout.stop_after_box rides in the row's task spec (make-dataset rl2 --stop-after-box): every /generate
    # request to SGLang carries the closing-brace stop ids; a row without it, none
    from gem_core.rollout.policy import closing_brace_ids

    braces = set(closing_brace_ids(tokenizer))
    episode = next(e for e in GOLDEN_EPISODES if e.env_id.startswith("game:GuessTheNumber"))
    for on in (True, False):
        server = FakeSGLang(tokenizer)
        spec = TaskSpec(episode.env_id, seed=episode.seed, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS, stop_after_box=on)
        sample = HeadSample(sample={"extra_info": {"gem_task": spec.to_json()}})
        try:
            asyncio.run(gem_rollout.generate(_head_config(), tokenizer, server.url, sample, post=_head_post))
        finally:
            server.close()
        stops = [set(body["sampling_params"].get("stop_token_ids") or ()) for path, body in server.calls if path == "/generate"]
        assert stops and sample.status is HeadSample.Status.DONE
        assert all((braces <= s) if on else not (braces & s) for s in stops), (on, stops)
