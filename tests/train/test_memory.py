"""Memory bounded by a token budget: micro-batches whose accumulated gradient is the one-batch gradient,
log-probabilities without full-vocabulary logits for the whole batch (chunked), gradient checkpointing."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.rollout.policies import MIN_SHARED_PREFIX, shared_prefix_length  # noqa: E402
from gem_core.train.loss import (  # noqa: E402
    Rows,
    chunked_logprobs,
    decoder_hidden_states,
    micro_batches,
    output_layer,
    token_logprobs,
    training_rows,
)
from gem_core.train.trainer import Trainer, TrainConfig  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from gem_core.testing import build_test_tokenizer, build_tiny_model

    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=2, seed=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _trainer(tiny, tmp_path, **overrides):
    import copy

    model, tokenizer = tiny
    # float32 (bf16 autocast is on by default where the CPU has it): these tests compare gradients to 1e-4
    config = TrainConfig(
        **{"out": str(tmp_path / "run"), "episodes_per_update": 6, "eval_episodes": 2, "max_turn_tokens": 6, "precision": "float32", **overrides}
    )
    return Trainer(config, copy.deepcopy(model), tokenizer)


@pytest.fixture(scope="module")
def batch(tiny, tmp_path_factory):
    """Rows of six real GuessTheNumber episodes of several turns each (rows of different lengths), played by
    scripted guesses; each turn an advantage of its own, rollout logprobs a little off the policy's (so the
    ratio is not 1 and the clip takes part)."""
    from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, ScriptedPolicy, run_episodes
    from gem_core.tasks import TaskSpec

    _model, tokenizer = tiny
    guesses = iter([1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 20)
    policy = ScriptedPolicy(tokenizer, lambda context: f"\\boxed{{{next(guesses)}}}")
    envs = [TaskSpec("game:GuessTheNumber-v0-easy").make_env() for _ in range(6)]
    try:
        trajectories = asyncio.run(run_episodes(envs, policy, ChatFormatter(tokenizer), RunConfig(params=SamplingParams(max_tokens=8)), seeds=list(range(6))))
    finally:
        for env in envs:
            env.close()
    assert sum(t.num_turns for t in trajectories) >= 2 * len(trajectories)
    rng = np.random.default_rng(0)
    advantages = [rng.normal(size=t.num_turns).tolist() for t in trajectories]
    rows = training_rows(trajectories, advantages, "sequence", tokenizer.pad_token_id)
    old = torch.from_numpy(rng.normal(-3.0, 1.0, size=tuple(rows.targets.shape))).float() * (rows.targets >= 0)
    return dataclasses.replace(rows, old_logprobs=old)


def _gradient(trainer, rows):
    trainer.model.zero_grad()
    loss, stats = trainer.accumulate_gradient(rows)
    return loss, stats, torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def test_micro_batches_hold_every_row_once_within_the_budget(batch):
    lengths = batch.attention.sum(1)
    budget = int(lengths.max()) * 2
    parts = micro_batches(batch, budget)
    assert len(parts) > 1
    assert sum(len(p.input_ids) for p in parts) == len(batch.input_ids)
    assert all(p.input_ids.numel() <= budget or len(p.input_ids) == 1 for p in parts)
    seen = sorted(tuple(row[: int(a.sum())].tolist()) for p in parts for row, a in zip(p.input_ids, p.attention))
    assert seen == sorted(tuple(row[: int(a.sum())].tolist()) for row, a in zip(batch.input_ids, batch.attention))
    # each part is cut to its own longest row: no column of padding alone
    assert all(bool(p.attention[:, -1].any()) for p in parts)
    # a budget smaller than a row: that row alone
    assert [len(p.input_ids) for p in micro_batches(batch, 1)] == [1] * len(batch.input_ids)


@pytest.mark.parametrize("terms", [{}, {"entropy_coef": 0.05}, {"kl_coef": 0.1}])
def test_the_accumulated_gradient_equals_the_one_batch_gradient(tiny, tmp_path, batch, terms):
    one_pass = _trainer(tiny, tmp_path / "one", micro_batch_tokens=10**9, **terms)
    parts = _trainer(tiny, tmp_path / "parts", micro_batch_tokens=int(batch.attention.sum(1).max()), **terms)
    try:
        for trainer in (one_pass, parts):  # a reference that differs from the policy, for the KL term
            if terms.get("kl_coef"):
                with torch.no_grad():
                    for p in trainer._reference().parameters():
                        p.add_(0.01)
        assert len(micro_batches(batch, parts.config.micro_batch_tokens)) >= 3
        loss_one, stats_one, grad_one = _gradient(one_pass, batch)
        references = None
        if terms.get("kl_coef"):
            with torch.no_grad():
                references = [parts.logprobs(parts._reference(), part) for part in micro_batches(batch, parts.config.micro_batch_tokens)]
        if references is not None:
            parts.model.zero_grad()
            loss_parts, stats_parts = parts.accumulate_gradient(batch, micro_batches(batch, parts.config.micro_batch_tokens), references)
            grad_parts = torch.cat([p.grad.flatten() for p in parts.model.parameters() if p.grad is not None])
            with torch.no_grad():
                one_ref = [one_pass.logprobs(one_pass._reference(), batch)]
            one_pass.model.zero_grad()
            loss_one, stats_one = one_pass.accumulate_gradient(batch, [batch], one_ref)
            grad_one = torch.cat([p.grad.flatten() for p in one_pass.model.parameters() if p.grad is not None])
        else:
            loss_parts, stats_parts, grad_parts = _gradient(parts, batch)
        assert grad_one.abs().max() > 0
        assert loss_parts == pytest.approx(loss_one, rel=1e-5, abs=1e-7)
        assert stats_parts.keys() == stats_one.keys()
        for key in stats_one:
            assert stats_parts[key] == pytest.approx(stats_one[key], rel=1e-5, abs=1e-7), key
        assert torch.allclose(grad_parts, grad_one, rtol=1e-4, atol=1e-7)
    finally:
        one_pass.close()
        parts.close()


def test_no_forward_holds_more_than_the_budget(tiny, tmp_path, batch):
    """The budget is what bounds memory: every forward of the update sees at most that many tokens."""
    budget = int(batch.attention.sum(1).max()) + 1
    trainer = _trainer(tiny, tmp_path, micro_batch_tokens=budget)
    seen = []
    decoder = output_layer(trainer.model)[0]
    handle = decoder.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    try:
        trainer.optimize(batch)
    finally:
        handle.remove()
        trainer.close()
    assert len(seen) >= 3 and max(seen) <= budget


def _full_softmax(model, rows, temperature):
    logits = model(input_ids=rows.input_ids, attention_mask=rows.attention).logits.float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    mask = rows.targets >= 0
    chosen = logp.gather(-1, rows.targets.clamp(min=0)[..., None])[..., 0] * mask
    entropy = -(logp.exp() * logp).sum(-1) * mask
    return chosen, entropy


@pytest.mark.parametrize("chunk", [1, 7, 10**6])
def test_chunked_logprobs_equal_the_full_softmax_and_its_gradient(tiny, batch, chunk):
    import copy

    # float64 weights: the two paths add the same terms in another order, which in float32 moves a gradient element
    # by more than 1e-4 relative on some batches; in float64 that order costs ~1e-12, and a wrong position still fails
    model = copy.deepcopy(tiny[0]).double()
    assert output_layer(model) is not None  # the chunked path is the one under test
    weights = torch.rand(batch.targets.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for fn in (lambda: token_logprobs(model, batch, 0.7, with_entropy=True, chunk_tokens=chunk), lambda: _full_softmax(model, batch, 0.7)):
        model.zero_grad()
        logprobs, entropy = fn()
        ((logprobs + 0.1 * entropy) * weights).sum().backward()
        grads.append((logprobs.detach(), entropy.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp, ent, grad), (lp_full, ent_full, grad_full) = grads
    assert torch.allclose(lp, lp_full, atol=1e-5)
    assert torch.allclose(ent, ent_full, atol=1e-5)
    assert torch.allclose(grad, grad_full, rtol=1e-4, atol=1e-6)
    assert (lp[batch.targets < 0] == 0).all() and (lp[batch.targets >= 0] < 0).all()


def test_chunked_logprobs_of_no_position():
    lm_head = torch.nn.Linear(4, 9, bias=False)
    chosen, entropy = chunked_logprobs(torch.zeros(0, 4), lm_head, torch.zeros(0, dtype=torch.long), 1.0, 8, with_entropy=True)
    assert chosen.shape == entropy.shape == (0,)


def test_a_model_whose_logits_are_scaled_takes_the_plain_path(tiny):
    import copy

    model = copy.deepcopy(tiny[0])
    ids = torch.tensor([[3, 4, 5, 6]])
    rows = Rows(ids, torch.ones_like(ids), torch.tensor([[4, 5, 6, -100]]), torch.zeros(1, 4), torch.zeros(1, 4))
    model.config.final_logit_softcapping = 30.0  # lm_head(hidden) is no longer the logits: not the chunked path
    assert output_layer(model) is None
    with torch.no_grad():
        assert torch.allclose(token_logprobs(model, rows), _full_softmax(model, rows, 1.0)[0], atol=1e-5)


def test_the_shared_prefix_runs_once_with_the_same_hidden_states_and_gradient(tiny, batch):
    """The rows' common prefix goes through the decoder once (a forward of one row of it, then the rows'
    rests); hidden states at every real token and the parameters' gradient equal the plain forward's."""
    import copy

    model = copy.deepcopy(tiny[0])
    decoder = output_layer(model)[0]
    lengths = batch.attention.sum(1).tolist()
    prefix = shared_prefix_length([batch.input_ids[i, :n].tolist() for i, n in enumerate(lengths)])
    assert prefix >= MIN_SHARED_PREFIX  # the episodes' common instruction: the shared path is the one under test
    seen = []
    handle = decoder.register_forward_pre_hook(lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    weights = torch.rand(batch.input_ids.shape + (model.config.hidden_size,), generator=torch.Generator().manual_seed(0))
    results = []
    try:
        for share in (True, False):
            model.zero_grad()
            hidden = decoder_hidden_states(decoder, batch, share_prefix=share)
            real = batch.attention.bool()[..., None]
            (hidden * weights * real).sum().backward()
            results.append((hidden.detach() * real, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    finally:
        handle.remove()
    rows, width = batch.input_ids.shape
    assert seen == [(1, prefix), (rows, width - prefix), (rows, width)]
    (hidden_shared, grad_shared), (hidden_plain, grad_plain) = results
    assert torch.allclose(hidden_shared, hidden_plain, atol=1e-5)
    assert grad_plain.abs().max() > 0
    # float32 sums in another order (the rows' gradients meet in the prefix, not at the parameters)
    assert float(torch.linalg.vector_norm(grad_shared - grad_plain)) <= 1e-5 * float(torch.linalg.vector_norm(grad_plain))


def test_shared_prefix_length_leaves_every_sequence_a_token_of_its_own():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token stays each one's own
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4, 5]]) == 2
    assert shared_prefix_length([[7, 2], [1, 2]]) == 0
    assert shared_prefix_length([[1, 2, 3]]) == 0 and shared_prefix_length([]) == 0 and shared_prefix_length([[1], []]) == 0


def test_gradient_checkpointing_gives_the_same_gradient(tiny, tmp_path, batch):
    plain = _trainer(tiny, tmp_path / "plain")
    checkpointed = _trainer(tiny, tmp_path / "ckpt", gradient_checkpointing=True)
    try:
        model = checkpointed.model
        assert model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") else model.is_gradient_checkpointing
        _, _, grad_plain = _gradient(plain, batch)
        _, _, grad_ckpt = _gradient(checkpointed, batch)
        assert torch.allclose(grad_plain, grad_ckpt, rtol=1e-4, atol=1e-7)
    finally:
        plain.close()
        checkpointed.close()


def test_a_run_reports_its_peak_memory(tiny, tmp_path):
    from gem_core.train.trainer import peak_rss_gb

    trainer = _trainer(tiny, tmp_path)
    try:
        metrics = trainer.update()
    finally:
        trainer.close()
    assert 0.05 < metrics["peak_rss_gb"] <= peak_rss_gb() + 0.001 < 64  # the metric is rounded to MB


def test_gradient_checkpointing_on_a_model_without_it_is_one_line(tiny, tmp_path, monkeypatch):
    import copy

    from gem_core.train import run

    model = copy.deepcopy(tiny[0])
    monkeypatch.setattr(type(model), "supports_gradient_checkpointing", False)
    monkeypatch.setattr(run, "load_model_and_weights", lambda name, seed=0: (model, tiny[1], {"model": "tiny", "source": "test", "files": {}}))
    config = TrainConfig(out=str(tmp_path / "run"), updates=1, episodes_per_update=2, eval_episodes=2, warm_start_steps=0, gradient_checkpointing=True)
    with pytest.raises(run.TrainError, match="gradient_checkpointing: .* does not support it"):
        run.train(config, progress=False, log=lambda _: None)
