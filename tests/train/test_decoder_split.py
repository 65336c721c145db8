"""The frozen lower layers once an update (gem_core.train.decoder): the decoder's hidden states and gradients from
``frozen_bottom`` + ``top_hidden_states`` are those of its whole forward bit for bit, with the shared prefix and
without, in float32 and under bf16 autocast; the trainer's update with a KL term is the same update either way;
where the split does not apply, nothing is split."""

from __future__ import annotations

import asyncio
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.train.decoder import decoder_hidden_states, frozen_bottom, frozen_layer_count, top_hidden_states  # noqa: E402
from gem_core.train.loss import output_layer, training_rows  # noqa: E402
from gem_core.train.model import freeze_lower_layers  # noqa: E402

LAYERS, TRAINED = 4, 2


@pytest.fixture(scope="module")
def tiny():
    from gem_core.testing import build_test_tokenizer, build_tiny_model

    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=LAYERS, seed=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    freeze_lower_layers(model, TRAINED)
    return model, tokenizer


@pytest.fixture(scope="module")
def rows(tiny):
    """Rows of five real GuessTheNumber episodes of different lengths (scripted guesses), right-padded."""
    from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, ScriptedPolicy, run_episodes
    from gem_core.tasks import TaskSpec

    _model, tokenizer = tiny
    guesses = iter([5, 3, 8, 1, 10, 2, 7, 4, 9, 6] * 20)
    policy = ScriptedPolicy(tokenizer, lambda context: f"\\boxed{{{next(guesses)}}}")
    envs = [TaskSpec("game:GuessTheNumber-v0-easy").make_env() for _ in range(5)]
    try:
        trajectories = asyncio.run(run_episodes(envs, policy, ChatFormatter(tokenizer), RunConfig(params=SamplingParams(max_tokens=8)), seeds=list(range(5))))
    finally:
        for env in envs:
            env.close()
    advantages = [[1.0 - 0.5 * i] * t.num_turns for i, t in enumerate(trajectories)]
    return training_rows(trajectories, advantages, "sequence", tokenizer.pad_token_id)


def _both(decoder, rows, share_prefix, weights):
    """(hidden, gradient) of the whole forward and of the split, each from zeroed gradients."""
    results = []
    for split in (False, True):
        decoder.zero_grad()
        if split:
            with torch.no_grad():
                bottom = frozen_bottom(decoder, rows, frozen_layer_count(decoder), share_prefix=share_prefix)
            hidden = top_hidden_states(decoder, rows, bottom)
        else:
            hidden = decoder_hidden_states(decoder, rows, share_prefix=share_prefix)
        (hidden * weights * rows.attention[..., None]).sum().backward()
        results.append((hidden.detach(), [p.grad.clone() for p in decoder.parameters() if p.requires_grad]))
    return results


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("share_prefix", [True, False], ids=["shared-prefix", "whole-rows"])
def test_the_split_gives_the_whole_forwards_hidden_states_and_gradient_bit_for_bit(tiny, rows, share_prefix, bf16):
    model = tiny[0]
    decoder = output_layer(model)[0]
    assert frozen_layer_count(decoder) == LAYERS - TRAINED
    weights = torch.rand(rows.input_ids.shape + (model.config.hidden_size,), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        (whole, whole_grad), (split, split_grad) = _both(decoder, rows, share_prefix, weights)
    assert torch.equal(whole, split)
    assert len(whole_grad) == len(split_grad) > 0 and any(g.abs().max() > 0 for g in whole_grad)
    assert all(torch.equal(a, b) for a, b in zip(whole_grad, split_grad))


def test_a_reference_with_the_same_frozen_layers_gets_its_own_top_from_the_shared_bottom(tiny, rows):
    """The reference model (a copy of the policy whose upper layers then moved) from the policy's frozen bottom:
    its own whole forward's hidden states, bit for bit; the policy's upper layers give other ones."""
    model = tiny[0]
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        for p in output_layer(reference)[0].layers[LAYERS - TRAINED :].parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        policy_decoder, reference_decoder = output_layer(model)[0], output_layer(reference)[0]
        bottom = frozen_bottom(policy_decoder, rows, frozen_layer_count(policy_decoder))
        shared = top_hidden_states(reference_decoder, rows, bottom)
        assert torch.equal(shared, decoder_hidden_states(reference_decoder, rows))
        assert not torch.equal(shared, top_hidden_states(policy_decoder, rows, bottom))


def test_the_trainers_update_with_a_kl_term_is_the_same_update_split_or_not(tiny, rows, tmp_path, monkeypatch):
    """Two optimizer steps (mini-batches) with a KL to the reference: the weights after them are the same bit for
    bit whether the frozen layers ran once (the trainer's way) or in every forward."""
    from gem_core.train import trainer as trainer_module
    from gem_core.train.trainer import Trainer, TrainConfig

    model, tokenizer = tiny
    config = dict(
        out=str(tmp_path / "run"), episodes_per_update=4, eval_episodes=2, max_turn_tokens=6, kl_coef=0.5, mini_batches=2, lr=1e-2, trained_layers=TRAINED
    )
    after = []
    calls = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(trainer_module, "frozen_layer_count", lambda decoder: 0)
        else:
            real = trainer_module.frozen_bottom
            monkeypatch.setattr(trainer_module, "frozen_bottom", lambda *a, **k: calls.append(1) or real(*a, **k))
        trainer = Trainer(TrainConfig(**config), copy.deepcopy(model), tokenizer)
        try:
            trainer._reference()
            with torch.no_grad():  # the reference apart from the policy, so the KL term has a gradient
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(0.01)
            trainer.optimize(rows, [f"e{i}" for i in range(rows.input_ids.shape[0])])
            after.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
        finally:
            trainer.close()
    assert calls  # the split ran
    split_weights, whole_weights = after
    moved = [k for k in split_weights if not torch.equal(split_weights[k], model.state_dict()[k])]
    assert moved and all(torch.equal(split_weights[k], whole_weights[k]) for k in split_weights)


def test_nothing_is_split_where_it_does_not_apply(tiny):
    model = copy.deepcopy(tiny[0])
    decoder = output_layer(model)[0]
    assert frozen_layer_count(decoder) == LAYERS - TRAINED
    every = copy.deepcopy(model)
    for p in every.parameters():
        p.requires_grad_(True)
    assert frozen_layer_count(output_layer(every)[0]) == 0  # nothing frozen
    for p in model.parameters():
        p.requires_grad_(False)
    assert frozen_layer_count(decoder) == 0  # everything frozen: nothing to train above
    checkpointed = copy.deepcopy(tiny[0])
    checkpointed.activation_checkpointing_enable()
    assert frozen_layer_count(output_layer(checkpointed)[0]) == 0
    dropout = copy.deepcopy(tiny[0])
    dropout.config.attention_dropout = 0.1
    assert frozen_layer_count(output_layer(dropout)[0]) == 0
