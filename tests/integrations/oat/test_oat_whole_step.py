"""One whole oat step from the README's oat commands (read from README.md), through oat-llm 0.2.4's own code
on CPU: ``gem-core make-dataset oat`` as written (only ``--out`` moved to a temp dir); the launcher's
``build_args`` on the README's arguments (``--gem-dataset`` pointed at that file; ``--rollout-batch-size
16`` instead of 128, so that oat's one CPU learner trains every step: oat's update interval is
rollout_batch_size / (learners x rollout_batch_size_per_device)); oat's ``ActorBase.init``/
``RewardActor.init`` then ``GemActor.init`` (the dataset loading); oat's ``MultiTurnFeedbackCollector``
calling ``PPOMultiTurnActor.step`` over the plugin's ``collect_experience``; ``process_feedback_data``
(turn returns, oat's subsampling); ``PPOLearner.learn`` (``MultiTurnTransitionDataset``, its ``collate_fn``
padding a batch of different lengths, DataLoader) and ``learning_step`` (the whitening, ``get_batch_logps``
on a real model, PPO loss with oat's truncated importance sampling and its KL term, backward, optimizer
step), under the accumulation the plugin's ``GemLearner`` sets: one optimizer step per pass (issue 64; the
accumulation's tests are at the end: several devices' counts and padding, consecutive steps).

Stand-ins, named: vLLM's ``LLM`` and ``SamplingParams`` (``gem_core.testing.vllm_engine``, scripted
players); the plasma IPC client (hands the object back); the model (``gem_core.testing.build_tiny_model``,
not Qwen3-1.7B) and its reference copy; DeepSpeed (import stub; ``DeepspeedStrategy`` where the step calls
it: ``all_reduce``, ``setup_dataloader``, ``backward`` and ``optimizer_step`` are oat's own, the engine they call
``oat_harness.EngineStandIn``: DeepSpeed's accumulation count from ``--train-batch-size``, its loss scaling, its
step at the accumulation boundary only, over a plain ``torch.optim.AdamW``); ``torch.cuda`` calls (CPU). Left
for a GPU: vLLM
generation and its sleep/wake, launchpad's processes and the learner's ``_init`` (DeepSpeed's ZeRO engine,
bf16, flash-attention, the fused LM head), the NCCL weight broadcast to vLLM, checkpoints.
"""

from __future__ import annotations

import re
import shlex
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import oat_stubs  # noqa: F401
from gem_core.algo import normalization_stats, normalize
from gem_core.testing.golden import golden_respond
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams

README = Path(__file__).resolve().parents[3] / "README.md"
OAT_EPS = 1e-9


def readme_oat_commands() -> tuple[list[str], list[str]]:
    """The README's oat block: the make-dataset arguments and the launcher's arguments (its trailing
    ``...`` dropped: the rest are oat's defaults)."""
    text = README.read_text()
    block = re.search(r"\*\*oat\*\*.*?```bash\n(.*?)```", text, re.S).group(1)
    make = next(line for line in block.splitlines() if line.startswith("gem-core make-dataset oat "))
    launch_lines, inside = [], False
    for line in block.splitlines():
        body = line.lstrip("# ").rstrip()
        if body.startswith("python -m gem_integrations.oat.launch"):
            inside = True
        if inside:
            launch_lines.append(body.rstrip("\\"))
            if not body.endswith("\\"):
                break
    launch = shlex.split(" ".join(launch_lines))
    assert launch[:3] == ["python", "-m", "gem_integrations.oat.launch"] and launch[-1] == "..."
    return shlex.split(make)[1:], launch[3:-1]


def _replace(argv: list[str], option: str, value: str) -> list[str]:
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


class _HandBack:
    """Stand-in for oat's PlasmaShmClient: the object itself crosses (no plasma store on CPU)."""

    def __init__(self, *_):
        pass

    def serialize_ipc(self, data):
        return data

    def deserialize_ipc(self, data):
        return data


class _CPUStrategy:
    """DeepspeedStrategy where oat's learn/learning_step call it: oat's own all_reduce and setup_dataloader
    (gloo), backward and optimizer_step (the engine's, :class:`oat_harness.EngineStandIn`: DeepSpeed is an import
    stub); ``grad_acc_step`` as oat's ``setup_distributed`` sets it."""

    def __init__(self, args):
        from oat.utils.deepspeed import DeepspeedStrategy

        self.args, self.world_size, self.seed = args, 1, args.seed
        self.grad_acc_step = args.train_batch_size // args.train_batch_size_per_device // self.world_size
        for name in ("all_reduce", "setup_dataloader", "backward", "optimizer_step"):
            setattr(self, name, types.MethodType(getattr(DeepspeedStrategy, name), self))

    def is_rank_0(self):
        return True

    def print(self, *_):
        pass

    def get_gradient_norm(self, model):
        return float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])))


@pytest.fixture()
def cpu_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # the README's GPU machine (oat's --gpus 8 default)


@pytest.fixture()
def env_count(monkeypatch):
    """Every env made through TaskSpec.make_env in this process, and how often each was closed."""
    from helpers.lifecycle import track_env_closes

    return track_env_closes(monkeypatch)


def _actor(args, tokenizer, tmp_path, monkeypatch):
    """GemActor through oat's own ActorBase.init/RewardActor.init and GemActor.init, vLLM replaced."""
    import oat.actors.base as actor_base
    import vllm

    from gem_integrations.oat.rollout import GemActor

    llm = VLLMFaithfulLLM(VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=args.max_model_len or 8192))
    monkeypatch.setattr(vllm, "LLM", lambda **_: llm, raising=False)
    monkeypatch.setattr(vllm, "SamplingParams", VLLMSamplingParams, raising=False)
    monkeypatch.setattr(actor_base.vllm, "__version__", "0.8.4", raising=False)
    monkeypatch.setattr(actor_base, "PlasmaShmClient", _HandBack)
    fields = set(VLLMSamplingParams.__dataclass_fields__)
    assert {"temperature", "top_p", "top_k", "max_tokens", "n", "logprobs"} <= fields, "the stand-in takes oat's sampling fields"
    actor = GemActor(ipc_server=None, vllm_args={}, args=args)  # what launchpad's CourierNode builds
    actor.init(0, str(tmp_path))
    assert actor.llm is llm and actor.tokenizer is tokenizer
    return actor, llm


def _learner(args, tokenizer, actor, model_dir):
    """GemLearner with what oat's LearnerBase/RLLearner/PPOLearner/PPOMultiTurnLearner._init set (that
    _init builds the DeepSpeed engine: GPU): oat's own ``oat.model.LLM`` over a tiny checkpoint (eager
    attention: flash-attention is GPU-only) and its frozen reference (--beta 0.1 is oat's default), AdamW
    in place of DeepSpeed's optimizer, the engine stand-in in ``LLM.model`` as oat's ``strategy.prepare`` puts
    DeepSpeed's (built from ``--train-batch-size``, ``--max-norm``), oat's collector and dataset builder, oat's
    aggregator choice."""
    import functools

    from oat.algorithms.ppo_multiturn import MultiTurnFeedbackCollector, MultiTurnTransitionDataset
    from oat.model import LLM
    from oat.utils.ops import masked_mean, masked_sum

    from gem_core.tiny import build_tiny_model
    from gem_integrations.oat.advantage import GemLearner
    from oat_harness import EngineStandIn

    if not (Path(model_dir) / "config.json").exists():
        build_tiny_model(len(tokenizer)).save_pretrained(model_dir)
    learner = GemLearner.__new__(GemLearner)
    learner.args, learner.actors, learner.tokenizer = args, [actor], tokenizer
    learner.strategy = _CPUStrategy(args)
    learner.model = LLM(str(model_dir), use_flash_attention_2=False, bf16=args.bf16, fp16=args.fp16).train()
    learner.ref_model = LLM(str(model_dir), use_flash_attention_2=False, bf16=args.bf16, fp16=args.fp16).eval() if args.beta > 0 else None
    learner.critic = None
    learner.optimizer = torch.optim.AdamW(learner.model.parameters(), lr=1e-2)
    learner.scheduler = None
    learner.model.model = EngineStandIn(
        learner.model.model,
        learner.optimizer,
        train_batch_size=args.train_batch_size,
        micro_batch_size=args.train_batch_size_per_device,
        world_size=learner.strategy.world_size,
        max_norm=args.max_norm,
    )
    learner.pi_buffer, learner.all_buffer = [], []
    learner.query_step = learner.global_step = learner.policy_sgd_step = 0
    learner.gradient_update_st = 0.0
    learner.dataset_builder = MultiTurnTransitionDataset  # PPOMultiTurnLearner._init
    learner.collector = MultiTurnFeedbackCollector(args, [actor], _HandBack())
    learner.masked_aggregator = functools.partial(masked_sum, constant_normalizer=args.generate_max_length) if args.critic_type == "drgrpo" else masked_mean
    learner.update_interval = args.rollout_batch_size // (learner.strategy.world_size * args.rollout_batch_size_per_device)
    return learner


class _NoZeRO3Gather:
    """Stand-in for ``deepspeed.zero.GatheredParameters`` (an import stub here); oat enables it only at
    ZeRO stage 3, and the README's run is stage 2 (oat's default), where it does nothing."""

    def __init__(self, params, enabled=True):
        assert not enabled, "ZeRO-3 gathering is not run on CPU"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_readme_oat_commands_through_one_whole_step(tokenizer, tmp_path, monkeypatch, cpu_torch, env_count):
    from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner

    from gem_core.cli import main as gem_core_main
    from gem_integrations.oat.dataset import read_specs
    from gem_integrations.oat.launch import build_args

    make_argv, launch_argv = readme_oat_commands()
    data = tmp_path / "train.jsonl"
    assert gem_core_main(_replace(make_argv, "--out", str(data))) == 0
    rows = read_specs(data)
    assert len(rows) == int(make_argv[make_argv.index("--n") + 1]) and {r.env_id for r in rows} == {make_argv[make_argv.index("--env") + 1]}

    argv = _replace(_replace(launch_argv, "--gem-dataset", str(data)), "--rollout-batch-size", "16")
    args = build_args(argv)
    assert (args.gamma, args.lam, args.critic_type, args.whiten_adv, args.gem_episodes_per_step, args.num_samples) == (0.9, 1.0, "drgrpo", True, 16, 1)
    assert args.eval_steps <= 0, "oat's prompt evaluation (its oracle, its prompt data) is off for the GEM actor"
    assert args.train_batch_size_per_device == 1 and args.beta > 0 and args.tis_c == 2.0  # oat's defaults, kept

    actor, llm = _actor(args, tokenizer, tmp_path, monkeypatch)
    assert actor.sampling_params.logprobs == 1 and actor.sampling_params.max_tokens == args.generate_max_length
    assert actor.gem_tasks.specs == rows  # the dataset loading: the README's rows, in order

    import oat.algorithms.ppo as oat_ppo

    monkeypatch.setattr(oat_ppo, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(GatheredParameters=_NoZeRO3Gather)))
    assert args.use_fused_lm_head and args.zero_stage == 2  # oat's fused LM head (pure torch) runs
    learner = _learner(args, tokenizer, actor, tmp_path / "model")
    assert learner.update_interval == 1

    # oat's LearnerBase.run, one iteration: the collector calls the actor's step
    env_count.clear()  # (make-dataset made one to check the id)
    feedback, actor_info = learner.collector.collect_feedback([""], [""], [""], None)
    assert len(feedback) == args.gem_episodes_per_step
    assert actor_info["actor/num_transitions"] == sum(len(e) for e in feedback)
    assert actor_info["gem/infra_failed_episodes"] == 0.0 and actor_info["actor/gem_num_episodes"] == 16.0
    assert sum(llm.calls) == actor_info["actor/num_transitions"] and len(llm.calls) < sum(llm.calls), "requests batched"
    assert len(env_count) == 16 and all(r["closed"] == 1 for r in env_count), "every env made was closed once"
    assert actor.gem_tasks.position == 16  # the first 16 rows were played
    for episode, spec in zip(feedback, rows[:16]):  # row i's episode starts from row i's first message
        assert spec.first_message() in episode[0].prompt

    transitions = [t for e in feedback for t in e]
    assert len(transitions) > args.rollout_batch_size_per_device, "oat subsamples this step"
    np.random.seed(0)
    learner.process_feedback_data(feedback)
    kept = list(learner.pi_buffer)
    assert len(kept) == args.rollout_batch_size_per_device == 16 and learner.query_step == 16

    seen = {}
    oat_step = PPOMultiTurnLearner.learning_step

    def spy(self, trajectory):
        seen["batch"] = trajectory
        return oat_step(self, trajectory)

    monkeypatch.setattr(PPOMultiTurnLearner, "learning_step", spy)
    before = [p.detach().clone() for p in learner.model.parameters()]
    info = learner.learn(1)  # oat's PPOLearner.learn: dataset, collate, DataLoader, learning_step

    batch = seen["batch"]
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[0] == 16 and lengths.min() < lengths.max() and (batch["attention_mask"] == 0).any(), "collate padded"
    # the whitening: population std over the kept transitions' discounted turn returns, eps 1e-9
    returns = np.asarray([float(t.info["returns"]) for t in kept])
    for t in kept:
        episode = next(e for e in feedback if any(x is t for x in e))
        j = next(i for i, x in enumerate(episode) if x is t)
        g = sum(0.9**k * x.rewards for k, x in enumerate(episode[j:]))
        assert float(t.info["returns"]) == pytest.approx(g, abs=1e-6)
    expected = normalize(returns, normalization_stats(returns, ddof=0), eps=OAT_EPS)
    assert np.asarray(batch["advantages"], dtype=np.float64) == pytest.approx(np.asarray(expected), abs=1e-5)
    assert returns.std() > 0  # not the constant corner: the check above can fail
    # the loss and the optimizer steps: one per pass over the 16 rows, though oat's accumulation count
    # (--train-batch-size, oat's 128) is more than the rows of every pass (issue 64)
    engine, passes = learner.model.model, args.num_ppo_epochs
    assert args.train_batch_size > 16 * passes and learner.strategy.grad_acc_step == 16
    assert engine.steps == [16] * passes and learner.policy_sgd_step == passes
    assert np.isfinite(info["train/pg_loss"]) and np.isfinite(info["train/kl3"]) and info["train/policy_grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters())), "AdamW moved the weights"
    assert info["train/adv_mean"] == pytest.approx(float(np.mean(expected)), abs=1e-5)


def test_learner_prompt_loop_comes_from_the_gem_rows_not_oats_prompt_data(tokenizer, tmp_path, monkeypatch, cpu_torch):
    """oat's LearnerBase.prepare_data loads --prompt-data (default: lkevinzc/tldr-with-sft-reference from the
    hub) for its step loop and its evaluation. With the GEM actor the loop is one batch per actor step: one
    epoch plays every README row once (1024 rows / 16 per step = 64 steps); nothing is downloaded."""
    import datasets

    from gem_core.cli import main as gem_core_main
    from gem_integrations.oat.launch import build_args

    make_argv, launch_argv = readme_oat_commands()
    data = tmp_path / "train.jsonl"
    assert gem_core_main(_replace(make_argv, "--out", str(data))) == 0
    args = build_args(_replace(_replace(launch_argv, "--gem-dataset", str(data)), "--rollout-batch-size", "16"))

    def no_download(*a, **k):
        raise AssertionError(f"oat's learner loaded a prompt dataset: {a}")

    monkeypatch.setattr(datasets, "load_dataset", no_download)
    monkeypatch.setattr(datasets, "load_from_disk", no_download)
    learner = _learner(args, tokenizer, None, tmp_path / "model")
    learner.prepare_data(learner.strategy, tokenizer)  # what oat's LearnerBase._init calls
    batches = list(learner.prompts_dataloader)
    assert len(batches) == 1024 // 16
    assert all(len(b[0]) == args.rollout_batch_size_per_device for b in batches)
    assert len(learner.prompts_dataset) == 1024  # oat's lr schedule reads it: steps x batch


def test_every_env_is_closed_when_the_engine_aborts(tokenizer, env_count):
    """GemActor.step with vLLM aborting two requests (finish_reason "abort", an infra failure): every env
    made is closed exactly once, the aborted episodes' included, and they are counted, not trained."""
    from gem_core.tasks import TaskSpec
    from oat_harness import make_actor

    specs = [TaskSpec("game:GuessTheNumber-v0-easy", seed=s) for s in range(6)]
    actor = make_actor(tokenizer, specs, max_tokens=256)
    generate, calls = actor.llm.generate, []

    def aborting(*a, **k):
        outputs = generate(*a, **k)
        calls.append(len(outputs))
        if len(calls) in (1, 2):  # one request of the first batch, one of the second
            outputs[0].outputs[0].finish_reason = "abort"
        return outputs

    actor.llm.generate = aborting
    episodes = actor.step()
    assert len(env_count) == 6 and [r["closed"] for r in env_count] == [1] * 6
    assert len(episodes) == 4 and episodes[0][0].info["gem/infra_failed_episodes"] == 2.0


def _register_crashing_env() -> str:
    """A three-turn env whose step ``crash_at`` raises (an env bug, not an infrastructure failure)."""
    import gem_core
    from gem_core.core import Env

    class Crashing(Env):
        def __init__(self, crash_at: int = 1):
            self.crash_at, self.t = crash_at, 0

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return "Answer three times.", {}

        def step(self, action):
            self.t += 1
            if self.t == self.crash_at:
                raise RuntimeError("env bug (test)")
            return "Again.", 0.5, self.t >= 3, False, {}

        def sample_random_action(self):
            return "x"

    gem_core.register("test:OatCrashes-v0", Crashing, override=True)
    return "test:OatCrashes-v0"


def test_every_env_is_closed_when_an_env_raises_mid_step(tokenizer, env_count):
    """One episode's env raises on its first step while the others are in flight: the step fails with that
    error, and every env made (in oat's actor, through the executor) is closed exactly once."""
    from gem_core.tasks import TaskSpec
    from oat_harness import make_actor

    crash = _register_crashing_env()
    specs = [TaskSpec("game:GuessTheNumber-v0-easy", seed=s) for s in range(5)] + [TaskSpec(crash, seed=9, env_kwargs={"crash_at": 1})]
    actor = make_actor(tokenizer, specs, max_tokens=256)
    with pytest.raises(RuntimeError, match="env bug"):
        actor.step()
    assert len(env_count) == 6 and [r["closed"] for r in env_count] == [1] * 6, env_count


# -- the accumulation (issue 64): each learning step one optimizer step per pass, its gradient the mean over its rows


@pytest.mark.parametrize(("counts", "micro"), [([7], 1), ([5, 5], 1), ([3, 5], 1), ([1, 4, 4], 1), ([2, 7, 3], 2), ([4, 1, 6, 2], 3)])
def test_accumulation_gives_every_device_the_same_micro_batches_and_the_mean_gradient(counts, micro):
    """Each device's plan from every device's row count (``counts``, one a device): the same micro-batches on every
    device (DeepSpeed's boundaries agree, or the gradient reduction hangs), padding up to the largest, a global batch
    DeepSpeed's ``set_train_batch_size`` accepts; and the step's gradient as DeepSpeed makes it (each micro-batch's
    mean over its rows of loss mask x row gradient, divided by the accumulation, summed; then the mean over
    devices) is the mean over every device's real rows."""
    from gem_integrations.oat.advantage import accumulation

    world, most, total = len(counts), max(counts), sum(counts)
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(n, 3)) for n in counts]  # each real row's gradient
    plans = [accumulation(n, most, total, world, micro) for n in counts]
    assert len({(p.micro_batches, p.rows, p.weight, p.train_batch_size) for p in plans}) == 1
    plan = plans[0]
    assert plan.micro_batches == -(-most // micro) and plan.rows == plan.micro_batches * micro
    assert plan.train_batch_size == plan.rows * world and plan.train_batch_size % (micro * world) == 0
    per_device = []
    for n, p, g in zip(counts, plans, grads):
        assert p.pad == p.rows - n >= 0
        rows = np.concatenate([g * p.weight, np.zeros((p.pad, 3))])  # the padding's loss mask is 0
        micro_batches = rows.reshape(p.micro_batches, micro, 3).mean(axis=1)
        per_device.append((micro_batches / p.micro_batches).sum(axis=0))
    assert np.mean(per_device, axis=0) == pytest.approx(np.concatenate(grads).mean(axis=0), rel=1e-12, abs=1e-15)
    if len(set(counts)) == 1 and micro == 1:  # one device, or equal rows: nothing added, nothing scaled
        assert plan.pad == 0 and plan.weight == 1.0


def test_accumulation_refuses_counts_that_cannot_be():
    from gem_integrations.oat.advantage import accumulation

    for local, most, total, world in [(0, 3, 3, 1), (4, 3, 7, 2), (3, 3, 7, 2), (2, 3, 2, 2)]:
        with pytest.raises(ValueError, match="inconsistent row counts"):
            accumulation(local, most, total, world)


def _steps(learner, episodes, tokenizer, monkeypatch):
    """``episodes`` through the harness learner's ``learning_step`` (oat's own, under GemLearner's); returns the
    batch oat's ``learning_step`` got."""
    from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner
    from oat_harness import learner_advantages

    seen = {}
    oat_step = PPOMultiTurnLearner.learning_step

    def spy(self, trajectory):
        seen["batch"] = trajectory
        return oat_step(self, trajectory)

    monkeypatch.setattr(PPOMultiTurnLearner, "learning_step", spy)
    learner.pi_buffer.clear()
    learner_advantages(learner, episodes, tokenizer)
    return seen["batch"]


def test_consecutive_learning_steps_each_take_one_optimizer_step_per_pass(tokenizer, monkeypatch):
    """Two learning steps on one engine, 3 then 4 turn rows, two passes each, oat's accumulation count 128: each
    pass is one optimizer step over its rows. Without the learner's accumulation no weight would move (oat's
    ``learning_step`` then fails on its gradient-norm metric); with the accumulation but DeepSpeed's micro-step
    counter left running, the second step's boundaries would fall after 2 and 6 of its micro-batches."""
    from gem_integrations.oat.advantage import rebn_args
    from oat_harness import gem_args, make_learner
    from test_oat import _synthetic

    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=16, num_ppo_epochs=2, tis_c=None), gamma=0.9))
    engine = learner.model
    assert learner.args.train_batch_size == 128 and engine.gradient_accumulation_steps() == 128
    for episodes, rows in (([[0.0, 0.0, 1.0]], 3), ([[0.5, -0.1], [0.0, 1.0]], 4)):
        batch = _steps(learner, _synthetic(episodes, tokenizer), tokenizer, monkeypatch)
        assert len(batch["input_ids"]) == rows and engine.gradient_accumulation_steps() == learner.strategy.grad_acc_step == rows
    assert engine.steps == [3, 3, 4, 4] and engine.micro_steps == 8


def test_a_device_with_fewer_rows_pads_to_the_largest_and_scales_its_rows(tokenizer, monkeypatch):
    """Device 0 of two (the other's rows simulated in ``all_reduce``: 5 there, 3 here): oat's ``learning_step`` gets
    5 rows, its own 3 with loss mask 2 x 5 / 8 (the step's gradient the mean over the 8 rows, see
    test_accumulation_...) and 2 copies of its shortest row with loss mask 0 and advantage 0; the engine's global
    batch is 10 (5 micro-batches a device), one optimizer step per pass."""
    from gem_integrations.oat.advantage import rebn_args
    from oat_harness import gem_args, make_learner
    from test_oat import _synthetic

    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=16, num_ppo_epochs=2, tis_c=None), gamma=0.9), world_size=2)
    other = 5.0

    def all_reduce(data, op="mean"):  # this device's count with the other device's
        return {"max": max(data, other), "sum": data + other}[op]

    learner.strategy.all_reduce = all_reduce
    episodes = _synthetic([[0.0, 0.0, 1.0]], tokenizer)
    batch = _steps(learner, episodes, tokenizer, monkeypatch)
    own = [t.prompt_ids + t.response_ids for t in episodes[0]]
    ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    shortest = min(own, key=len)
    assert ids == [*own, shortest, shortest]
    assert batch["loss_masks"] == pytest.approx([1.25, 1.25, 1.25, 0.0, 0.0]) and list(batch["advantages"][3:]) == [0.0, 0.0]
    assert any(a != 0 for a in batch["advantages"][:3])
    engine = learner.model
    assert engine.gradient_accumulation_steps() == learner.strategy.grad_acc_step == 5 and engine.steps == [5, 5]


def test_the_learner_refuses_an_engine_inside_an_accumulation(tokenizer):
    """An engine whose micro-step counter is between two boundaries holds gradients of micro-batches no step took:
    the learner says so rather than fold them into its step."""
    from gem_integrations.oat.advantage import rebn_args
    from oat_harness import gem_args, learner_advantages, make_learner
    from test_oat import _synthetic

    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=16, tis_c=None), gamma=0.9))
    learner.model.micro_steps = 1
    with pytest.raises(RuntimeError, match="inside an accumulation"):
        learner_advantages(learner, _synthetic([[0.0, 1.0]], tokenizer), tokenizer)
