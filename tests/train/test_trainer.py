"""The reference trainer: the loss, the update direction, the advantages it uses, checkpoints and resume,
and the CLI's answers to bad arguments."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.train.trainer import Rows, Trainer, TrainConfig, policy_loss, token_logprobs, training_rows, turn_advantages  # noqa: E402


def _trainer(tiny, tmp_path, **overrides):
    from transformers import AutoModelForCausalLM

    path, _, tokenizer = tiny
    config = TrainConfig(**{"out": str(tmp_path / "run"), "episodes_per_update": 4, "eval_episodes": 4, **overrides})
    return Trainer(config, AutoModelForCausalLM.from_pretrained(path), tokenizer)


def test_bf16_autocasts_the_training_forward_only_where_asked(tiny, tmp_path, monkeypatch):
    """bf16 (on by default where the device computes in bfloat16) runs the forward under bfloat16 autocast:
    log-probs close to float32's but not equal (so autocast really ran), float32 out, and the weights and their
    gradients stay float32."""
    from gem_core import precision

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    plain = _trainer(tiny, tmp_path)
    assert plain.bf16 is False  # the default on a CPU without bfloat16 arithmetic
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert _trainer(tiny, tmp_path).bf16 is True and _trainer(tiny, tmp_path, precision="float32").bf16 is False
    half = _trainer(tiny, tmp_path, precision="bf16")
    try:
        trajectories = plain.rollout([0, 1], prefix="t-")
        rows = training_rows(trajectories, [[1.0] * t.num_turns for t in trajectories], "sequence", plain.pad_id)
        half.model.load_state_dict(plain.model.state_dict())
        with torch.no_grad():
            full, autocast = plain.logprobs(plain.model, rows), half.logprobs(half.model, rows)
        mask = rows.targets >= 0
        assert autocast.dtype == torch.float32
        assert not torch.equal(full[mask], autocast[mask])
        assert torch.allclose(full[mask], autocast[mask], atol=0.1)
        half.accumulate_gradient(rows)
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in half.model.parameters() if p.grad is not None)
    finally:
        plain.close()
        half.close()
    with pytest.raises(ValueError, match="training.precision='yes'"):
        TrainConfig(precision="yes")


def test_bf16_rolls_out_on_a_bfloat16_copy_that_follows_every_optimizer_step(tiny, tmp_path):
    """Under bf16 the hf engine generates with a bfloat16 copy of the model (its buffers left float32, as
    ``from_pretrained(dtype=bfloat16)`` keeps them), the same copy each rollout, its trained weights those of the
    model after the last optimizer step; float32 generates with the model itself."""
    from gem_core.testing import build_tiny_model

    tokenizer = tiny[2]
    plain = _trainer(tiny, tmp_path, precision="float32")
    two_layers = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=2)
    half = Trainer(
        TrainConfig(out=str(tmp_path / "half"), episodes_per_update=4, eval_episodes=4, precision="bf16", trained_layers=1, lr=0.5, warmup_updates=0),
        two_layers,
        tokenizer,
    )
    try:
        assert plain.rollout_model() is plain.model and plain.policy(2).model is plain.model
        copy = half.rollout_model()
        assert copy is not half.model and half.policy(2).model is copy
        assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copy.parameters())
        assert [b.dtype for b in copy.buffers()] == [b.dtype for b in half.model.buffers()]
        trained = [name for name, p in half.model.named_parameters() if p.requires_grad]
        assert trained and len(trained) < len(list(half.model.parameters()))  # the embeddings frozen: the refresh skips them
        for p in half.model.parameters():
            if p.requires_grad:
                p.grad = torch.ones_like(p)
        before = {name: p.clone() for name, p in copy.named_parameters()}
        half.optimizer.step()
        assert half.rollout_model() is copy
        for (name, mine), source in zip(copy.named_parameters(), half.model.parameters()):
            assert torch.equal(mine, source.detach().to(torch.bfloat16)), name
            assert torch.equal(mine, before[name]) != (name in trained), name  # the trained ones moved, the frozen did not
        assert len(half.rollout([0, 1], prefix="t-")) == 2
    finally:
        plain.close()
        half.close()


def test_train_layers_trains_the_top_layers_alone_with_the_full_models_gradient(tmp_path):
    """--train-layers N freezes the embeddings (and the output layer tied to them) and every decoder layer below
    the top N: one update leaves them bit-identical and moves the top layer; the top layer's gradient is the one
    the fully trained model gets (freezing stops the backward pass, it does not change what flows above); the
    optimizer holds only what is trained; a model with N layers or fewer trains every weight."""
    from gem_core.testing import build_test_tokenizer, build_tiny_model
    from gem_core.train.trainer import freeze_lower_layers

    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=2)
    model.config.pad_token_id = tokenizer.pad_token_id
    path = tmp_path / "two-layers"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    full = _trainer((str(path), model, tokenizer), tmp_path / "full", lr=1e-2)
    top = _trainer((str(path), model, tokenizer), tmp_path / "top", lr=1e-2, trained_layers=1)
    try:
        trajectories = full.rollout([0, 1, 2, 3], prefix="f-")
        advantages = [[1.0 if i % 2 == 0 else -1.0] * t.num_turns for i, t in enumerate(trajectories)]
        rows = training_rows(trajectories, advantages, "sequence", full.pad_id)
        grads = []
        for trainer in (full, top):
            trainer.optimizer.zero_grad()
            loss, _ = policy_loss(trainer.logprobs(trainer.model, rows), rows, clip=0.2)
            loss.backward()
            grads.append({name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None})
        trained = set(grads[1])
        assert trained and all(name.startswith("model.layers.1.") or name == "model.norm.weight" for name in trained)
        assert not any(name.startswith(("model.layers.0.", "model.embed_tokens", "lm_head")) for name in trained)
        for name in trained:
            assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7), name
        optimized = {id(p) for group in top.optimizer.param_groups for p in group["params"]}
        assert optimized == {id(p) for p in top.model.parameters() if p.requires_grad}
        before = {name: p.detach().clone() for name, p in top.model.named_parameters()}
        top.optimizer.step()
        after = dict(top.model.named_parameters())
        for name, value in before.items():
            assert torch.equal(value, after[name].detach()) == (name not in trained), name
    finally:
        full.close()
        top.close()
    whole = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=2)
    assert freeze_lower_layers(whole, 2) is False and all(p.requires_grad for p in whole.parameters())  # as many as it has: all
    with pytest.raises(ValueError, match="trained_layers"):
        TrainConfig(trained_layers=-1)


def test_a_run_saved_before_train_layers_existed_resumes_training_every_weight(tmp_path):
    """config.json of a run from before --train-layers has no such key: resumed, that run keeps training every
    weight (the default, 10, would freeze layers its checkpoint's optimizer trained); a saved value is kept;
    a config.json that is not an object is no saved run."""
    from gem_core.train.run import saved_config
    from gem_core.train.trainer import config_dict

    for name, record, want in (("old", {}, 0), ("new", {"trained_layers": 4}, 4)):
        out = tmp_path / name
        out.mkdir()
        saved = {k: v for k, v in config_dict(TrainConfig(out=str(out))).items() if k != "trained_layers"}
        (out / "config.json").write_text(json.dumps({**saved, **record, "weights": {}}))
        assert saved_config(str(out)).trained_layers == want, name
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    assert saved_config(str(tmp_path / "list")) is None


def test_cpu_bf16_is_read_from_the_cpus_flags(tmp_path):
    """bf16 where the CPU computes in it; the flags that name a machine in a record of its weights, in one order."""
    from gem_core.precision import cpu_has_bf16, kernel_flags

    info = tmp_path / "cpuinfo"
    cases = (
        ("fpu avx2 avx512f", False, ["avx2", "avx512f"]),
        ("fpu avx512f avx512_bf16 avx512_vnni avx2", True, ["avx2", "avx512f", "avx512_bf16"]),
        ("fpu amx_tile amx_bf16", True, ["amx_bf16", "amx_tile"]),
    )
    for flags, has, named in cases:
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        assert cpu_has_bf16(str(info)) is has, flags
        assert kernel_flags(str(info)) == named, flags
    assert cpu_has_bf16(str(tmp_path / "missing")) is False and kernel_flags(str(tmp_path / "missing")) == []


def test_generation_batches_stay_within_one_updates_episodes(tiny, tmp_path):
    """The evaluation's episodes are generated at most ``episodes`` at a time (its 100 at once held three
    times the KV cache of an update's 32), and a rollout hands freed memory back without failing."""
    import gem_core.train.trainer as trainer_module

    trainer = _trainer(tiny, tmp_path, episodes_per_update=2, eval_episodes=5)
    sizes: list[int] = []
    in_play: list[int | None] = []
    policy = trainer.policy
    trainer.policy = lambda batch_size: sizes.append(batch_size) or policy(batch_size)
    run_episodes = trainer_module.run_episodes

    def recorded(*args, **kwargs):
        in_play.append(kwargs.get("max_concurrency"))
        return run_episodes(*args, **kwargs)

    trainer_module.run_episodes = recorded
    try:
        stats = trainer.evaluate()
        trainer.update()
    finally:
        trainer_module.run_episodes = run_episodes
        trainer.close()
    assert sizes == [2, 2, 2] and 0.0 <= stats.sampled.success_rate <= 1.0  # greedy, sampled, then the update
    assert in_play == [2, 2, 2]  # as many episodes in play as a batch holds: each keeps its KV cache between turns


def test_one_update_moves_good_responses_up_and_bad_ones_down(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path, lr=1e-2)
    try:
        trajectories = trainer.rollout([0, 1, 2, 3], prefix="t-")
        advantages = [[1.0 if i % 2 == 0 else -1.0] * t.num_turns for i, t in enumerate(trajectories)]
        rows = training_rows(trajectories, advantages, "turn", trainer.pad_id)
        with torch.no_grad():
            before = token_logprobs(trainer.model, rows)
        loss, _ = policy_loss(token_logprobs(trainer.model, rows), rows, clip=0.2)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        with torch.no_grad():
            after = token_logprobs(trainer.model, rows)
        mask = rows.targets >= 0
        change = ((after - before) * mask).sum(1)
        sign = torch.tensor([float(a[m][0]) for a, m in zip(rows.advantages, mask)])
        assert (change[sign > 0] > 0).all() and (change[sign < 0] < 0).all()
    finally:
        trainer.close()


def test_the_loss_is_the_clipped_policy_gradient_by_hand():
    # two samples: three target positions in row 0, one in row 1
    targets = torch.tensor([[5, 6, 7, -100], [-100, -100, 8, -100]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, -2.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [0.0, 0.0, -1.0, 0.0]])
    new = torch.tensor([[-0.9, -2.5, -0.5, 0.0], [0.0, 0.0, -0.7, 0.0]])
    rows = Rows(None, None, targets, advantages, old)
    loss, stats = policy_loss(new, rows, clip=0.2)
    by_hand = 0.0
    for r, t in [(0, 0), (0, 1), (0, 2), (1, 2)]:
        ratio = math.exp(new[r, t] - old[r, t])
        a = float(advantages[r, t])
        by_hand += -min(ratio * a, min(max(ratio, 0.8), 1.2) * a)
    assert float(loss) == pytest.approx(by_hand / 4, rel=1e-5)
    assert stats["clip_fraction"] == pytest.approx(2 / 4)  # exp(0.1)-1 < 0.2 < both others


def test_the_entropy_bonus_is_subtracted_by_hand_over_model_tokens_only():
    targets = torch.tensor([[5, 6, -100], [-100, 8, -100]])
    zeros = torch.zeros(2, 3)
    rows = Rows(None, None, targets, zeros, zeros)
    entropy = torch.tensor([[1.0, 2.0, 50.0], [70.0, 0.5, 90.0]])  # large values where there is no target
    loss, stats = policy_loss(zeros, rows, clip=0.2, entropy=entropy, entropy_coef=0.1)
    assert stats["entropy"] == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert float(loss) == pytest.approx(-0.1 * (1.0 + 2.0 + 0.5) / 3)


def test_token_entropy_is_the_entropy_of_the_next_token_distribution(tiny):
    _path, model, _tokenizer = tiny
    ids = torch.tensor([[3, 4, 5, 6]])
    rows = Rows(ids, torch.ones_like(ids), torch.tensor([[4, 5, 6, -100]]), torch.zeros(1, 4), torch.zeros(1, 4))
    logprobs, entropy = token_logprobs(model, rows, 2.0, with_entropy=True)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits.float() / 2.0, dim=-1)
    assert torch.allclose(entropy[:, :3], -(probs * probs.log()).sum(-1)[:, :3], atol=1e-5)
    assert float(entropy[0, 3]) == 0.0  # no target in that column: not computed
    assert torch.allclose(logprobs, token_logprobs(model, rows, 2.0))


def test_token_logprobs_equal_the_full_softmax_where_rows_have_targets(tiny):
    """Logits are computed only at columns with a target (logits_to_keep); the numbers must be those of
    the full forward pass, each row at its own target positions, 0 elsewhere."""
    _path, model, _tokenizer = tiny
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 0]])
    attention = torch.tensor([[1] * 6, [1] * 5 + [0]])
    targets = torch.tensor([[-100, -100, 6, 7, -100, -100], [-100, 11, -100, -100, 13, -100]])
    rows = Rows(ids, attention, targets, torch.zeros(2, 6), torch.zeros(2, 6))
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), dim=-1)
        expected = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * (targets >= 0)
        got = token_logprobs(model, rows)
    assert torch.allclose(got, expected, atol=1e-5)
    assert (got[targets < 0] == 0).all() and (got[targets >= 0] < 0).all()


class _PlainForward(torch.nn.Module):
    """A causal LM whose forward does not take ``logits_to_keep``: the full logits, sliced by the caller."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class _KeepsEverything(_PlainForward):
    """Takes ``logits_to_keep`` but returns every column: must not be read as the kept columns."""

    def forward(self, input_ids, attention_mask, logits_to_keep=0):
        return super().forward(input_ids, attention_mask)


@pytest.mark.parametrize("wrapper", [_PlainForward, _KeepsEverything])
def test_token_logprobs_are_the_same_whatever_the_model_does_with_logits_to_keep(tiny, wrapper):
    _path, model, _tokenizer = tiny
    ids = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    targets = torch.tensor([[-100, 5, -100, -100], [-100, -100, 10, -100]])
    rows = Rows(ids, torch.ones_like(ids), targets, torch.zeros(2, 4), torch.zeros(2, 4))
    with torch.no_grad():
        assert torch.allclose(token_logprobs(wrapper(model), rows), token_logprobs(model, rows), atol=1e-6)


def test_both_views_give_the_same_loss_and_gradient(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path)
    try:
        trajectories = trainer.rollout([5, 6, 7, 8], prefix="v-")
        advantages = turn_advantages(trajectories, "rebn", 0.9)
        grads = []
        for view in ("turn", "sequence"):
            trainer.model.zero_grad()
            rows = training_rows(trajectories, advantages, view, trainer.pad_id)
            loss, _ = policy_loss(token_logprobs(trainer.model, rows), rows, clip=0.2)
            loss.backward()
            grads.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in trainer.model.parameters()])))
        assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5, abs=1e-7)
        assert torch.allclose(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-6)
    finally:
        trainer.close()


def test_the_trainer_uses_the_reference_advantages_of_the_golden_scenario():
    from gem_core.testing.golden import golden_scenario

    golden = golden_scenario()
    ours = turn_advantages(golden.trajectories, "rebn", golden.gamma)
    for mine, reference in zip(ours, golden.turn_advantages):
        np.testing.assert_allclose(mine, reference, rtol=0, atol=1e-12)
    assert turn_advantages(golden.trajectories, "reinforce", 0.9)[0] == pytest.approx(golden.turn_returns[0])


def _rl_lines(path):
    drop = {"rollout_seconds", "update_seconds", "peak_rss_gb"}
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in open(path) if '"rl"' in line]


def test_a_resumed_run_continues_exactly_as_an_uninterrupted_one(tiny, tmp_path):
    from gem_core.train.run import train

    path = tiny[0]
    # a linear KL schedule is spread over the run's --steps, so a run of 2 extended to 4 follows another schedule:
    # constant here (a run cut short and resumed with its own --steps: tests/train/test_determinism.py)
    common = dict(
        model=path,
        episodes_per_update=4,
        eval_episodes=4,
        eval_every=2,
        warm_start_steps=2,
        warm_start_batch=4,
        checkpoint_every=1,
        seed=3,
        kl_schedule="constant",
    )
    whole = train(TrainConfig(updates=4, out=str(tmp_path / "whole"), **common), progress=False, log=lambda _: None)
    train(TrainConfig(updates=2, out=str(tmp_path / "cut"), **common), progress=False, log=lambda _: None)
    resumed = train(TrainConfig(updates=4, out=str(tmp_path / "cut"), resume=True, **common), progress=False, log=lambda _: None)
    assert resumed.steps == whole.steps == 4
    assert _rl_lines(tmp_path / "cut" / "metrics.jsonl") == _rl_lines(tmp_path / "whole" / "metrics.jsonl")
    assert resumed.final == whole.final
    assert (tmp_path / "whole" / "model" / "config.json").exists()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "whole" / "curves.png").stat().st_size > 1000


def test_a_run_killed_in_its_first_update_resumes_after_its_warm_start(tiny, tmp_path, monkeypatch):
    """The warm start and the start's evaluation are checkpointed before the first update (on CPU they can take an
    hour of a long run): a run killed in update 1 resumes from there, to the uninterrupted run's numbers."""
    from gem_core.train import run as run_module
    from gem_core.train.trainer import Trainer

    common = dict(
        model=tiny[0],
        updates=2,
        episodes_per_update=4,
        eval_episodes=4,
        warm_start_steps=2,
        warm_start_batch=4,
        checkpoint_every=5,
        seed=5,
        kl_schedule="constant",
    )
    whole = run_module.train(TrainConfig(out=str(tmp_path / "whole"), **common), progress=False, log=lambda _: None)

    def killed(self):
        raise KeyboardInterrupt  # what a kill during the first update leaves: the start's checkpoint alone

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "update", killed)
        with pytest.raises(KeyboardInterrupt):
            run_module.train(TrainConfig(out=str(tmp_path / "cut"), **common), progress=False, log=lambda _: None)
    assert run_module.load_checkpoint(str(tmp_path / "cut" / run_module.CHECKPOINT))["step"] == 0
    warm_starts = []
    monkeypatch.setattr(run_module, "warm_start", lambda *args: warm_starts.append(args))  # a resumed run does not redo it
    resumed = run_module.train(TrainConfig(out=str(tmp_path / "cut"), resume=True, **common), progress=False, log=lambda _: None)
    assert warm_starts == []
    assert resumed.steps == whole.steps == 2
    assert resumed.start == whole.start and resumed.final == whole.final
    assert _rl_lines(tmp_path / "cut" / "metrics.jsonl") == _rl_lines(tmp_path / "whole" / "metrics.jsonl")


def test_eval_every_saves_the_model_at_each_of_those_evaluations(tiny, tmp_path):
    """--eval-every N: the model after update N, 2N, ... in checkpoints/update-K (what the other trainers'
    mappings save at the experiment's evaluation points, for gem-core eval); the last one is the final model."""
    from safetensors.torch import load_file

    from gem_core.train.run import eval_checkpoint, train

    config = TrainConfig(
        model=tiny[0],
        updates=4,
        episodes_per_update=4,
        eval_episodes=2,
        eval_every=2,
        warm_start_steps=0,
        estimator="reinforce",
        lr=1e-2,
        out=str(tmp_path / "r"),
    )
    train(config, progress=False, log=lambda _: None)
    saved = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    assert saved == ["update-2", "update-4"]
    weights = {name: load_file(os.path.join(eval_checkpoint(config.out, step), "model.safetensors")) for step, name in ((2, "2"), (4, "4"))}
    final = load_file(str(tmp_path / "r" / "model" / "model.safetensors"))
    assert all(torch.equal(final[k], weights["4"][k]) for k in final)
    assert any(not torch.equal(weights["2"][k], weights["4"][k]) for k in final)  # two updates apart
    assert (tmp_path / "r" / "checkpoints" / "update-2" / "tokenizer_config.json").exists()


def test_the_warm_start_is_the_same_for_the_same_seed(tiny, tmp_path):
    """The warm start's random moves come from per-request streams: the episodes ask in an order set by
    scheduling, and a shared stream made two runs with one seed differ."""
    from gem_core.train.run import warm_start

    weights, losses = [], []
    for attempt in range(2):
        trainer = _trainer(tiny, tmp_path / str(attempt))
        try:
            losses.append(warm_start(trainer, steps=2, batch=4))
            weights.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
        finally:
            trainer.close()
    assert losses[0] == losses[1]
    assert torch.equal(weights[0], weights[1])


def test_a_run_directory_is_not_overwritten(tiny, tmp_path):
    from gem_core.train.run import TrainError, train

    config = TrainConfig(model=tiny[0], updates=1, episodes_per_update=2, eval_episodes=2, warm_start_steps=0, out=str(tmp_path / "r"))
    train(config, progress=False, log=lambda _: None)
    with pytest.raises(TrainError, match="--resume"):
        train(config, progress=False, log=lambda _: None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "game:NoSuchGame-v0"], "no env registered"),
        (["--episodes-per-update", "0"], "--episodes-per-update"),
        (["--gamma", "1.5"], "--gamma"),
        (["--gamma", "nan"], "--gamma"),
        (["--model", "/no/such/model/dir"], "no such directory"),
        (["--lr", "0"], "--lr"),
        (["--estimator", "grpo"], "group_size"),
        (["--episodes-per-update", "6", "--group-size", "4"], "a multiple of rollout.group_size (4)"),
        (["--env-kwargs", "{nope"], "--env-kwargs"),
        (["--updates", "ten"], "--updates"),
        (["--device", "cuda"], "CUDA"),
        (["--resume"], "no checkpoint"),
        (["--tensorboard", "--updates", "1"], "tensorboard"),
        (["--micro-batch-tokens", "0"], "--micro-batch-tokens"),
        (["--trained-layers", "-1"], "--trained-layers"),
        (["--rollout-engine", "sglang"], "--rollout-engine"),
        (["--rollout-engine", "vllm", "--updates", "1"], "vllm"),
        (["--env", "vision:Geometry-v0", "--model", "tiny"], "gem-core train trains text models"),
    ],
)
def test_bad_arguments_get_one_clear_line(argv, message, tmp_path, capsys):
    from gem_core.cli import main

    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a CUDA device is available")
    if "--tensorboard" in argv and importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed")
    if argv[:2] == ["--rollout-engine", "vllm"] and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed")
    if "vision:Geometry-v0" in argv and importlib.util.find_spec("PIL") is None:
        pytest.skip("Pillow (the vision extra) is not installed")
    code = main(["train", "--out", str(tmp_path / "r"), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("gem-core: error:", "gem-core train: error:"))


def test_the_cli_resumes_to_the_saved_number_of_updates(tiny, tmp_path, capsys):
    """`gem-core train --resume` without --steps continues to the saved run's --steps, not the default."""
    from gem_core.cli import main

    out = str(tmp_path / "r")
    common = ["--model", tiny[0], "--out", out, "--no-progress", "--episodes-per-update", "2", "--eval-episodes", "2", "--warm-start-steps", "0"]
    assert main(["train", "--updates", "2", *common]) == 0
    assert main(["train", "--resume", *common]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    assert max(line["step"] for line in lines) == 2
    assert main(["train", "--resume", "--updates", "3", *common]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    assert [line["step"] for line in lines if line["phase"] == "rl"] == [1, 2, 3]
    printed = capsys.readouterr().out
    assert "RL changed the held-out success rate" in printed
    assert "at the start" in printed and "warm start" not in printed  # no warm start ran: not labelled as one
    # the tiny model wins nothing: the summary says its run ended at the ceiling, not only the ceiling's value
    assert "this run ended at or below the hint-blind ceiling (sampled and greedy)" in printed


def test_steps_0_is_the_warm_start_alone_its_model_evaluated_once_and_saved(tiny, tmp_path, capsys):
    """`gem-core train --steps 0`: the warm start, one evaluation after it, its model saved (the start other
    trainers take in the cross-framework benchmark); no RL update, and no "RL changed" line."""
    from safetensors.torch import load_file

    from gem_core.cli import main

    out = tmp_path / "r"
    argv = ["train", "--updates", "0", "--model", tiny[0], "--out", str(out), "--no-progress", "--episodes-per-update", "2", "--eval-episodes", "2"]
    assert main([*argv, "--warm-start-steps", "1"]) == 0
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [line["phase"] for line in lines] == ["warm_start"]
    printed = capsys.readouterr().out
    assert "after the warm start, greedy" in printed and "RL updates" not in printed and "RL changed" not in printed
    assert "checkpoint.pt" not in printed and not (out / "checkpoint.pt").exists()  # nothing to resume: no RL state
    saved = load_file(str(out / "model" / "model.safetensors"))
    start = {name: param for name, param in tiny[1].state_dict().items() if name in saved}
    assert start and any(not torch.equal(saved[name], start[name]) for name in start)  # the warm start moved it


def test_episode_stats_count_malformed_and_illegal_turns():
    """The rates a run reports beside success, per turn and apart from each other: a turn with no
    readable move (a format error, which ends the episode) and a move the rules refuse (out of range,
    a repeat)."""
    import asyncio

    from gem_core.registry import make
    from gem_core.rollout import ChatFormatter, RunConfig, ScriptedPolicy, run_episodes
    from gem_core.testing import build_test_tokenizer
    from gem_core.train.trainer import EpisodeStats

    tokenizer = build_test_tokenizer("chatml")
    env = make("game:GuessTheNumber-v0-easy")
    seed = 0
    env.reset(seed=seed)
    while env.target == 3:  # episode b's first guess, 3, must be a miss
        seed += 1
        env.reset(seed=seed)

    def play(moves):
        def respond(context):
            return moves[context.count("<|im_start|>assistant") - 1]

        return asyncio.run(run_episodes([env], ScriptedPolicy(tokenizer, respond), ChatFormatter(tokenizer), RunConfig(), seeds=[seed]))[0]

    try:
        a = play(["\\boxed{11}", "\\boxed{11}", "no move here"])  # out of range twice, then no move: ends
        b = play(["\\boxed{3}", "\\boxed{3}", "\\boxed{30}", "\\boxed{0}"])  # a hint, a repeat, out of range twice
    finally:
        env.close()
    assert (a.num_turns, b.num_turns) == (3, 4)
    stats = EpisodeStats.of([a, b])
    assert stats.malformed_rate == pytest.approx(1 / 7)
    assert stats.illegal_rate == pytest.approx(5 / 7)
    assert stats.success_rate == 0.0
    assert EpisodeStats.of([b]).malformed_rate == 0.0


@pytest.mark.parametrize(("flag", "expected"), [([], False), (["--no-warm-start-transcript"], False), (["--warm-start-transcript"], True)])
def test_the_warm_start_objective_is_a_cli_flag(flag, expected, tmp_path):
    from gem_core.cli import build_parser
    from gem_core.train.cli import config_from_args

    args = build_parser().parse_args(["train", "--out", str(tmp_path / "r"), *flag])
    assert config_from_args(args).warm_start_transcript is expected


@pytest.mark.parametrize("transcript", [True, False])
def test_a_run_reports_the_fields_the_readme_names(tiny, tmp_path, transcript):
    """metrics.jsonl lines carry step, success, return, turns and the malformed/illegal turn rates (and
    the eval_ copies of the last evaluation); the summary table and the warm-start line show the rates."""
    import re

    from gem_core.train.run import read_metrics, train

    logs: list[str] = []
    config = TrainConfig(
        model=tiny[0], updates=2, episodes_per_update=2, eval_episodes=2, eval_every=1, warm_start_steps=1, warm_start_batch=2,
        warm_start_transcript=transcript, out=str(tmp_path / "r"),
    )  # fmt: skip
    summary = train(config, progress=False, log=logs.append)
    lines = read_metrics(str(tmp_path / "r" / "metrics.jsonl"))
    assert lines[0]["phase"] == "warm_start"
    assert {"eval_success_rate", "eval_malformed_rate", "eval_illegal_rate"} <= lines[0].keys()
    rl = [line for line in lines if line["phase"] == "rl"]
    assert [line["step"] for line in rl] == [1, 2]
    for line in rl:
        assert {"success_rate", "mean_return", "mean_turns", "malformed_rate", "illegal_rate"} <= line.keys()
        assert 0.0 <= line["malformed_rate"] <= 1.0 and 0.0 <= line["illegal_rate"] <= 1.0
    assert rl[-1]["eval_malformed_rate"] == summary.final.sampled.malformed_rate
    assert rl[-1]["eval_greedy_illegal_rate"] == summary.final.greedy.illegal_rate
    for line in (lines[0], rl[-1]):  # every evaluation: greedy and sampled, with the hint-use rates
        assert {"eval_hint_consistent_rate", "eval_greedy_hint_consistent_rate", "eval_hint_right_way_rate", "eval_greedy_hint_right_way_rate"} <= line.keys()
    assert set(lines[0]["baselines"]) == {b.name for b in summary.baselines}

    header, _, *rows = summary.table().splitlines()
    labels = [re.split(r"\s{2,}", row.strip())[0] for row in rows]
    assert labels[:4] == [
        "after the warm start, greedy",
        "after the warm start, sampled (T=1)",
        "after 2 RL updates, greedy",
        "after 2 RL updates, sampled (T=1)",
    ]
    assert labels[4:] == [f"baseline: {b.name}" for b in summary.baselines]
    assert re.split(r"\s{2,}", header.strip())[4:6] == ["malformed turns", "illegal turns"]
    final_row = re.split(r"\s{2,}", rows[3].strip())
    assert final_row[5:7] == [f"{summary.final.sampled.malformed_rate:.3f}", f"{summary.final.sampled.illegal_rate:.3f}"]
    warm_row = re.split(r"\s{2,}", rows[0].strip())
    assert warm_row[5:7] == [f"{summary.start.greedy.malformed_rate:.3f}", f"{summary.start.greedy.illegal_rate:.3f}"]
    learnt = "learning the whole transcripts" if transcript else "learning the moves alone"
    assert any(line.startswith("warm start: 1 supervised steps") and learnt in line and "malformed turns" in line for line in logs)


def test_an_update_leaves_infra_failed_episodes_out_of_the_loss_and_the_statistics(tiny, tmp_path, monkeypatch):
    import gem_core.train.trainer as trainer_module

    trainer = _trainer(tiny, tmp_path, lr=1e-2)
    played = trainer.rollout
    failed_ids: list[str] = []

    def rollout_with_a_dead_worker(seeds, *, prefix, group_size=1):
        trajectories = played(seeds, prefix=prefix, group_size=group_size)
        trajectories[1].infra_error = "python sandbox: worker 3 died"  # as the runner marks it
        failed_ids.append(trajectories[1].episode_id)
        return trajectories

    seen: dict[str, list] = {}
    original_batch = trainer_module.batch_of

    def recording_batch(trajectories, *args, **kwargs):  # the update's one batch: loss and advantages
        seen["episodes"] = [t.episode_id for t in trajectories]
        return original_batch(trajectories, *args, **kwargs)

    monkeypatch.setattr(trainer, "rollout", rollout_with_a_dead_worker)
    monkeypatch.setattr(trainer_module, "batch_of", recording_batch)
    try:
        metrics = trainer.update()
    finally:
        trainer.close()
    assert metrics["infra_failed_episodes"] == 1.0
    assert failed_ids[0] not in seen["episodes"] and len(seen["episodes"]) == trainer.config.episodes_per_update - 1


def test_the_cli_without_options_is_the_default_run(tmp_path):
    """`gem-core train` with no options trains TrainConfig()'s run: the embedded real model, a warm start,
    the measured defaults (every field, so a CLI default that drifts from the dataclass fails here)."""
    from gem_core.cli import build_parser
    from gem_core.train.cli import config_from_args
    from gem_core.train.trainer import DEFAULT_MODEL

    config = config_from_args(build_parser().parse_args(["train"]))
    assert config == TrainConfig()
    assert (config.model, config.warm_start_steps, config.env_id) == (DEFAULT_MODEL, 8, "game:GuessTheNumber-v0-easy")
    assert (config.trained_layers, config.stop_after_box, config.warm_start_transcript) == (10, True, False)
    flags = ([], ["--precision", "bf16"], ["--precision", "float32"])
    assert [config_from_args(build_parser().parse_args(["train", *flag])).precision for flag in flags] == ["auto", "bf16", "float32"]


def test_the_auto_rollout_engine_is_vllm_only_on_cuda_with_vllm_installed(monkeypatch):
    import gem_core.train.trainer as trainer_module

    assert trainer_module.resolve_rollout_engine(TrainConfig(device="cpu")) == "hf"
    assert trainer_module.resolve_rollout_engine(TrainConfig(device="cpu", rollout_engine="vllm")) == "vllm"
    found = {"vllm": object()}
    monkeypatch.setattr(trainer_module.importlib.util, "find_spec", lambda name: found.get(name))
    assert trainer_module.resolve_rollout_engine(TrainConfig(device="cuda")) == "vllm"
    assert trainer_module.resolve_rollout_engine(TrainConfig(device="cpu")) == "hf"
    found.clear()
    assert trainer_module.resolve_rollout_engine(TrainConfig(device="cuda:1")) == "hf"


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", "bfloat16"), ("float32", "float32")])
def test_the_vllm_engine_generates_in_the_runs_precision(precision, dtype, tiny, tmp_path, monkeypatch):
    """The vLLM engine starts in the dtype the hf engine generates in: bfloat16 under bf16 (the float32 master
    weights cast by the engine as it loads them), float32 otherwise."""
    import gem_core.train.trainer as trainer_module

    started = {}

    def from_pretrained(path, **kwargs):
        started.update(kwargs)
        return object()

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(trainer_module.importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(trainer_module.VLLMPolicy, "from_pretrained", staticmethod(from_pretrained))
    trainer = _trainer(tiny, tmp_path, rollout_engine="vllm", precision=precision)
    try:
        trainer._start_vllm()
        assert started["dtype"] == dtype
    finally:
        trainer.close()


def test_the_tiny_scale_names_a_model_built_here():
    from gem_core.train.run import load_model
    from gem_core.train.trainer import TINY_RUN

    config = TrainConfig(**{**TINY_RUN, "out": "unused"})
    model, tokenizer = load_model(config.model)
    assert config.warm_start_steps > 0 and model.config.num_hidden_layers == 2
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")


def test_a_bfloat16_checkpoint_trains_float32_master_weights(tiny, tmp_path):
    """A checkpoint saved in bfloat16 (most hub models, SmolLM2's included) is loaded in float32: --bf16 autocasts
    the forward, and the weights and AdamW's state stay float32 (transformers alone would keep bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gem_core.train.run import load_model

    path, _, tokenizer = tiny
    AutoModelForCausalLM.from_pretrained(path).to(torch.bfloat16).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).dtype == torch.bfloat16  # what transformers' default keeps
    model, _ = load_model(str(tmp_path))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_mini_batches_are_consecutive_episodes_each_an_optimizer_step(tiny, tmp_path):
    """--mini-batches N: the batch's episodes in N consecutive parts, an optimizer step on each. Two steps on
    halves equal the one-step trainer stepping on each half in turn (weights bit for bit); a run that took
    one step on the whole batch does not; the turn view's rows split with their episodes, as the sequence
    view's; more parts than episodes give one an episode; update() takes N Adam steps."""
    from gem_core.train.trainer import batch_of, mini_batch_rows, rows_of

    two = _trainer(tiny, tmp_path / "two", lr=1e-2, mini_batches=2)
    one = _trainer(tiny, tmp_path / "one", lr=1e-2, mini_batches=1)
    whole = _trainer(tiny, tmp_path / "whole", lr=1e-2, mini_batches=1)
    try:
        one.model.load_state_dict(two.model.state_dict())
        whole.model.load_state_dict(two.model.state_dict())
        trajectories = two.rollout([0, 1, 2, 3], prefix="m-")
        advantages = [[(-1.0) ** i * (i + 1)] * t.num_turns for i, t in enumerate(trajectories)]
        batch = batch_of(trajectories, "sequence")
        rows = rows_of(batch, batch.per_token([a for values in advantages for a in values]), two.pad_id)
        halves = mini_batch_rows(rows, batch.episode_ids, 2)
        assert [int(h.input_ids.shape[0]) for h in halves] == [2, 2]
        assert torch.equal(torch.cat([h.advantages for h in halves]), rows.advantages)
        two.optimize(rows, batch.episode_ids)
        for half in halves:
            one.optimize(half)
        whole.optimize(rows)
        trained = [name for name, p in two.model.named_parameters() if p.requires_grad]
        state = {name: p for name, p in two.model.named_parameters()}
        assert all(torch.equal(state[n], p) for n, p in one.model.named_parameters() if n in trained)
        assert not all(torch.equal(state[n], p) for n, p in whole.model.named_parameters() if n in trained)

        turns = batch_of(trajectories, "turn")
        turn_rows = rows_of(turns, turns.per_token(np.zeros(len(turns.turn_slots()))), two.pad_id)
        turn_parts = mini_batch_rows(turn_rows, turns.episode_ids, 2)
        counts = [sum(t.num_turns for t in trajectories[:2]), sum(t.num_turns for t in trajectories[2:])]
        assert [int(p.input_ids.shape[0]) for p in turn_parts] == counts
        assert len(mini_batch_rows(rows, batch.episode_ids, 9)) == 4  # one an episode, never an empty step
        assert [int(p.input_ids.shape[0]) for p in mini_batch_rows(rows, None, 3)] == [2, 1, 1]

    finally:
        for trainer in (two, one, whole):
            trainer.close()
    stepped = _trainer(tiny, tmp_path / "update", mini_batches=2, kl_coef=0.1)  # the KL term: a gradient whatever the advantages
    try:
        stepped.update()
        assert {int(s["step"]) for s in stepped.optimizer.state.values()} == {2}
    finally:
        stepped.close()
    with pytest.raises(ValueError, match="mini_batches"):
        TrainConfig(episodes_per_update=4, mini_batches=5)
    with pytest.raises(ValueError, match="mini_batches"):
        TrainConfig(mini_batches=0)


def test_every_default_the_help_states_is_the_one_a_run_gets():
    # `gem-core train --help` said "--kl-coef ... (default 0: off)" while a run took 0.1: a number in a help
    # text's "(default N" is read back and compared with TrainConfig's value for that option
    import argparse
    import re

    from gem_core.train.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = TrainConfig()
    checked = []
    for action in parser._actions:
        found = re.search(r"\(default (-?[0-9][0-9.e-]*)", action.help or "")
        if found and hasattr(defaults, action.dest) and not isinstance(getattr(defaults, action.dest), tuple):
            assert float(found.group(1)) == float(getattr(defaults, action.dest)), (action.option_strings, found.group(0))
            checked.append(action.dest)
    assert {"kl_coef", "entropy_coef", "lr", "updates", "episodes_per_update", "mini_batches", "group_size", "temperature", "seed"} <= set(checked)


def test_a_checkpoint_cut_short_keeps_the_last_one_and_a_broken_one_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    # a sweep stopped while it saved left a truncated checkpoint.pt, and --resume died in a traceback: the save is
    # now whole or not at all, and an unreadable checkpoint is one line (exit 2)
    import torch

    from gem_core.cli import main
    from gem_core.train import run as run_module

    out = tmp_path / "r"
    common = ["--model", tiny[0], "--out", str(out), "--no-progress", "--episodes-per-update", "2", "--eval-episodes", "2", "--warm-start-steps", "0"]
    assert main(["train", "--updates", "1", *common]) == 0
    saved = (out / "checkpoint.pt").read_bytes()

    def killed(state, path):  # the process dies half way through writing
        open(path, "wb").write(b"PK\x03\x04 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        run_module.save_checkpoint({"step": 2}, str(out / "checkpoint.pt"))
    assert (out / "checkpoint.pt").read_bytes() == saved and not [p for p in out.iterdir() if p.name.startswith(".checkpoint.pt")]
    monkeypatch.undo()

    (out / "checkpoint.pt").write_bytes(saved[: len(saved) // 2])  # cut short by something else
    capsys.readouterr()
    assert main(["train", "--resume", *common]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # (transformers' loading bar before it)
    assert "Traceback" not in err and "checkpoint.pt cannot be read" in last and "run without --resume" in last, err
