"""The oat plugin against oat-llm 0.2.4's own code: the golden scenario through GemActor (oat's
``PPOMultiTurnActor.step`` and ``ActorBase.generate`` over a vLLM-faithful LLM) gives the core
reference's trajectories as Transitions; those Transitions through oat's ``PPOMultiTurnLearner``
(``process_feedback_data``, ``MultiTurnTransitionDataset``, ``learning_step``'s whitening with oat's
``DeepspeedStrategy.all_reduce`` over gloo) get exactly ReBN: gamma 0.9, ddof 0, eps 1e-9, on one and on
two processes, normalised after oat's subsampling (and before it with GemLearner's option)."""

from __future__ import annotations

import dataclasses
import socket

import numpy as np
import pytest
import torch

from gem_core.algo import rebn
from gem_core.tasks import TaskSpec
from gem_core.testing.golden import GOLDEN_EPISODES, GOLDEN_GAMMA, GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, golden_scenario, tool_episodes
from oat_harness import gem_args, learner_advantages, make_actor, make_learner

OAT_EPS = 1e-9
DESIGN_EPISODES = [[0.0, 0.0, 1.0], [0.5, -0.1], [0.0]]
SCENARIO = GOLDEN_EPISODES + tool_episodes()  # the Python-tool episode too
DESIGN_OAT_VALUES = [0.7085, 0.9164, 1.1474, -0.2156, -1.3939, -1.1628]  # docs/DESIGN.md, oat's whitening


@pytest.fixture(scope="module")
def reference(tokenizer):
    return golden_scenario(tokenizer=tokenizer, episodes=SCENARIO)


def _specs():
    return [TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS) for e in SCENARIO]


@pytest.fixture(scope="module")
def played(tokenizer):
    actor = make_actor(tokenizer, _specs(), max_tokens=GOLDEN_PARAMS.max_tokens)
    episodes = actor.step()  # oat's own step: collect_experience, then its info update on every transition
    return actor, episodes


def test_version_check():
    from gem_integrations.oat.plugin_spec import PLUGIN

    assert PLUGIN.check_version() == "0.2.4"
    from gem_core.plugins import discover

    assert discover()["oat"].distribution == "oat-llm"


def test_golden_through_the_actor(played, reference, tokenizer):
    from oat.types import Transition

    actor, episodes = played
    assert any("python" in e.tools for e in SCENARIO), "the tool-env episode is part of the scenario"
    assert len(episodes) == len(reference.trajectories)
    keys = None
    for episode, trajectory in zip(episodes, reference.trajectories):
        assert len(episode) == trajectory.num_turns
        for t, (transition, turn) in enumerate(zip(episode, trajectory.turns)):
            assert isinstance(transition, Transition)
            for f in dataclasses.fields(Transition):
                assert getattr(transition, f.name) is not None, f.name
            assert transition.prompt_ids == trajectory.context_ids(t)
            assert transition.prompt == tokenizer.decode(trajectory.context_ids(t), skip_special_tokens=False)
            assert transition.response_ids == turn.response_ids
            assert transition.response_logprobs == pytest.approx(turn.logprobs, abs=0)
            assert transition.rewards == turn.reward
            assert transition.response == turn.response_text and transition.action == turn.action
            assert transition.obs == (trajectory.initial_message if t == 0 else trajectory.turns[t - 1].message)
            assert transition.done == (t == trajectory.num_turns - 1 and trajectory.done)
            assert transition.response_is_truncated == (turn.finish_reason == "length")
            assert transition.action_is_formatted == (not turn.info.get("format_error", False))
            assert transition.loss_mask is True
            assert isinstance(transition.info, dict) and all(isinstance(v, (int, float, np.floating)) for v in transition.info.values())
            keys = keys or set(transition.info)
            assert set(transition.info) == keys
    assert {"actor/mean_episode_return", "actor/gem_num_episodes", "gem/turn"} <= keys  # oat's step added its own
    # the scenario covers a cut response, a format error and a context limit
    flat = [t for e in episodes for t in e]
    assert any(t.response_is_truncated for t in flat) and any(not t.action_is_formatted for t in flat)
    assert any(e[-1].info["gem/context_limit"] == 1.0 for e in episodes)
    # the requests of one loop iteration went to vLLM as one batch (every turn once)
    assert sum(actor.llm.calls) == sum(len(e) for e in episodes)
    assert max(actor.llm.calls) > 1 and len(actor.llm.calls) < sum(actor.llm.calls)
    # each request: oat's sampling params copied, with gem_core's max_tokens, the stop tokens and logprobs
    _, params = actor.llm.engine.requests[0]
    assert params.max_tokens == GOLDEN_PARAMS.max_tokens and params.logprobs == 1 and params.n == 1 and params.stop_token_ids
    assert actor.sampling_params.stop_token_ids is None  # oat's own object untouched


def test_collector_metrics(played):
    """oat's MultiTurnFeedbackCollector.get_metrics averages every info key over all transitions."""
    from oat.algorithms.ppo_multiturn import MultiTurnFeedbackCollector

    _, episodes = played
    metrics = MultiTurnFeedbackCollector.get_metrics(None, 1.0, episodes)
    assert metrics["actor/num_transitions"] == sum(len(e) for e in episodes)
    assert np.isfinite(metrics["gem/episode_return"])


def _expected(reference):
    returns = [r for t in reference.trajectories for r in t.returns(GOLDEN_GAMMA)]
    return np.asarray(rebn([t.rewards for t in reference.trajectories], gamma=GOLDEN_GAMMA, ddof=0, eps=OAT_EPS)), returns


def _by_input(episodes):
    return {tuple(t.prompt_ids) + tuple(t.response_ids): i for i, t in enumerate(t for e in episodes for t in e)}


def test_learner_gives_rebn(played, reference, tokenizer):
    from gem_integrations.oat.advantage import rebn_args

    _, episodes = played
    n = sum(len(e) for e in episodes)
    args = rebn_args(gem_args(rollout_batch_size_per_device=n, critic_type="drgrpo", tis_c=None), gamma=GOLDEN_GAMMA)
    assert args.whiten_adv and args.lam == 1.0
    learner = make_learner(args)
    applied = learner_advantages(learner, [list(e) for e in episodes], tokenizer)
    assert len(applied) == n
    expected, returns = _expected(reference)
    index = _by_input(episodes)
    for ids, advantage in applied:
        assert advantage == pytest.approx(expected[index[ids]], abs=1e-5)
    # oat's compute_advantages (no critic) gave the discounted turn returns
    for t in learner.pi_buffer:
        i = index[tuple(t.prompt_ids) + tuple(t.response_ids)]
        assert float(t.info["returns"]) == pytest.approx(returns[i], abs=1e-6)
        assert float(t.info["values"]) == 0.0


def test_rebn_args_refuses_a_critic():
    from gem_integrations.oat.advantage import rebn_args

    with pytest.raises(ValueError, match="no critic"):
        rebn_args(gem_args(critic_type="ppo"))


def _synthetic(episodes_rewards, tokenizer):
    from oat.types import Transition

    out = []
    for e, rewards in enumerate(episodes_rewards):
        episode = []
        for t, r in enumerate(rewards):
            prompt = tokenizer.encode(f"episode {e} turn {t}", add_special_tokens=False)
            response = tokenizer.encode(f"answer {e}.{t}", add_special_tokens=False)
            episode.append(
                Transition(
                    obs="o",
                    action="a",
                    rewards=r,
                    done=t == len(rewards) - 1,
                    prompt="p",
                    prompt_ids=prompt,
                    response="r",
                    response_ids=response,
                    response_logprobs=[-0.5] * len(response),
                    response_is_truncated=False,
                    action_is_formatted=True,
                    loss_mask=True,
                    info={},
                )
            )
        out.append(episode)
    return out


def test_design_golden_values_single_device(tokenizer):
    from gem_integrations.oat.advantage import rebn_args

    episodes = _synthetic(DESIGN_EPISODES, tokenizer)
    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=6, tis_c=None), gamma=0.9))
    applied = dict(learner_advantages(learner, episodes, tokenizer))
    got = [applied[tuple(t.prompt_ids) + tuple(t.response_ids)] for e in episodes for t in e]
    assert got == pytest.approx(DESIGN_OAT_VALUES, abs=1e-4)


def test_normalised_after_subsampling(tokenizer):
    """oat keeps rollout_batch_size_per_device transitions at random, then whitens those: the statistics
    are the kept turns' (ReBN's stats option with the kept subset); GemLearner's option uses all turns."""
    from gem_integrations.oat.advantage import rebn_args

    rewards = [[0.0, 0.0, 1.0], [0.5, -0.1], [0.0], [1.0, 0.2, -0.3, 0.4]]
    episodes = _synthetic(rewards, tokenizer)
    index = _by_input(episodes)
    returns = np.asarray([g for r in rewards for g in _returns(r, 0.9)])
    np.random.seed(3)
    applied = learner_advantages(make_learner(rebn_args(gem_args(rollout_batch_size_per_device=5, tis_c=None), gamma=0.9)), episodes, tokenizer)
    kept = np.asarray([index[ids] for ids, _ in applied])
    assert len(kept) == 5
    sub = returns[kept]
    assert [a for _, a in applied] == pytest.approx(list((sub - sub.mean()) / (sub.std() + OAT_EPS)), abs=1e-5)
    full = np.asarray(rebn(rewards, gamma=0.9, ddof=0, eps=OAT_EPS))
    assert not np.allclose([a for _, a in applied], full[kept], atol=1e-3)  # the two choices differ here

    np.random.seed(3)
    args = rebn_args(gem_args(rollout_batch_size_per_device=5, tis_c=None, gem_rebn_before_subsampling=True), gamma=0.9)
    assert not args.whiten_adv
    applied = learner_advantages(make_learner(args), _synthetic(rewards, tokenizer), tokenizer)
    kept = np.asarray([index[ids] for ids, _ in applied])
    assert [a for _, a in applied] == pytest.approx(list(full[kept]), abs=1e-5)


def _returns(rewards, gamma):
    out, running = [], 0.0
    for r in reversed(rewards):
        running = r + gamma * running
        out.append(running)
    return out[::-1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_devices_whiten_globally(tokenizer, tmp_path):
    """Two gloo processes, each with its own episodes: oat's learning_step all-reduces the sums, so both
    get ReBN over the union (DESIGN.md's values), not over their own shard."""
    import torch.multiprocessing as mp

    import oat_workers

    port = _free_port()
    mp.spawn(oat_workers.two_device_worker, args=(str(tmp_path), port, DESIGN_EPISODES), nprocs=2, join=True)
    got = {}
    for rank in range(2):
        got.update(torch.load(tmp_path / f"rank{rank}.pt"))
    episodes = _synthetic(DESIGN_EPISODES, tokenizer)
    values = [got[tuple(t.prompt_ids) + tuple(t.response_ids)] for e in episodes for t in e]
    assert values == pytest.approx(DESIGN_OAT_VALUES, abs=1e-4)


def test_the_launcher_takes_oats_arguments_plus_env_ids(monkeypatch):
    import torch
    from gem_integrations.oat.launch import build_args

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # oat's validation counts GPUs; this machine has none
    common = ["--pretrain", "tiny", "--gpus", "1", "--rollout-batch-size", "8", "--rollout-batch-size-per-device", "8",
              "--pi-buffer-maxlen-per-device", "8", "--train-batch-size", "8", "--train-batch-size-per-device", "8"]  # fmt: skip
    args = build_args([*common, "--gem-env", "game:GuessTheNumber-v0", "game:Mastermind-v0-easy", "--gamma", "0.95", "--critic-type", "drgrpo"])
    assert args.gem_env == ["game:GuessTheNumber-v0", "game:Mastermind-v0-easy"]
    assert (args.gamma, args.lam, args.whiten_adv, args.critic_type, args.num_samples) == (0.95, 1.0, True, "drgrpo", 1)
    assert args.algo.name == "PPO"  # oat's validation turns the name into its RLAlgo enum
    before = build_args([*common, "--gem-env", "game:GuessTheNumber-v0", "--critic-type", "grpo", "--gem-rebn-before-subsampling"])
    assert before.gem_rebn_before_subsampling and not before.whiten_adv  # GemLearner whitens the whole batch itself
    with pytest.raises(SystemExit, match="--gem-env"):
        build_args(common)
    with pytest.raises(ValueError, match="no critic"):
        build_args([*common, "--gem-env", "game:GuessTheNumber-v0", "--critic-type", "ppo"])


def test_equal_returns_give_zero_advantages_not_nan(tokenizer):
    """oat's whitening takes sqrt(E[x^2] - mean^2) in float32: five equal returns of 0.7 make it negative
    and every advantage NaN. GemLearner whitens with the core's normalisation: 0, as rebn gives."""
    from gem_integrations.oat.advantage import rebn_args

    rewards = [[0.7]] * 5
    assert rebn(rewards, gamma=0.9, ddof=0, eps=OAT_EPS).tolist() == [0.0] * 5
    advantages = torch.tensor([np.float32(0.7)] * 5)  # what oat computes, as learning_step does
    mean = advantages.sum() / 5
    assert torch.isnan(torch.sqrt((advantages**2).sum() / 5 - mean**2))  # the corner is real in oat's formula
    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=5, tis_c=None), gamma=0.9))
    applied = learner_advantages(learner, _synthetic(rewards, tokenizer), tokenizer)
    assert [a for _, a in applied] == [0.0] * 5
    assert learner.args.whiten_adv  # oat's own flag is back for the next step


def _aborting(llm, prompts):
    """vLLM's answer to an aborted request (finish_reason "abort") for each prompt in ``prompts``."""
    generate = llm.generate

    def generate_or_abort(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        for output in outputs:
            if tuple(output.prompt_token_ids) in prompts:
                output.outputs[0].finish_reason = "abort"
        return outputs

    return generate_or_abort


def test_infra_failed_episodes_are_dropped_from_the_batch_and_counted(reference, tokenizer):
    """Episode 0's second request and episode 2's first are aborted by the engine (Trajectory.infra_error):
    neither reaches oat's learner, so neither is in the loss or in the whitening statistics, and oat's
    collector reports 2 in gem/infra_failed_episodes. An episode that played no turn (context limit at
    the start, not an infra failure) is dropped too: oat's step reads every episode's last transition."""
    from oat.algorithms.ppo_multiturn import MultiTurnFeedbackCollector

    from gem_integrations.oat.advantage import rebn_args

    trajectories = reference.trajectories
    assert trajectories[0].num_turns >= 2 and trajectories[2].num_turns >= 1
    specs = [*_specs(), TaskSpec("game:GuessTheNumber-v0-easy", seed=5, max_context_tokens=8)]
    actor = make_actor(tokenizer, specs, max_tokens=GOLDEN_PARAMS.max_tokens)
    actor.llm.generate = _aborting(actor.llm, {tuple(trajectories[0].context_ids(1)), tuple(trajectories[2].context_ids(0))})
    episodes = actor.step()
    kept = [t for i, t in enumerate(trajectories) if i not in (0, 2)]
    assert [[x.response_ids for x in e] for e in episodes] == [[turn.response_ids for turn in t.turns] for t in kept]
    metrics = MultiTurnFeedbackCollector.get_metrics(None, 1.0, episodes)
    assert metrics["gem/infra_failed_episodes"] == 2.0 and metrics["gem/infra_failed_fraction"] == pytest.approx(2 / len(specs))
    assert metrics["actor/gem_num_episodes"] == len(specs)

    n = sum(len(e) for e in episodes)
    learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=n, critic_type="drgrpo", tis_c=None), gamma=GOLDEN_GAMMA))
    applied = dict(learner_advantages(learner, [list(e) for e in episodes], tokenizer))
    expected = rebn([t.rewards for t in kept], gamma=GOLDEN_GAMMA, ddof=0, eps=OAT_EPS)
    got = [applied[tuple(x.prompt_ids) + tuple(x.response_ids)] for e in episodes for x in e]
    assert got == pytest.approx(list(expected), abs=1e-5)  # the statistics of the kept episodes only
    with_partial = rebn([trajectories[0].rewards[:1], *[t.rewards for t in kept]], gamma=GOLDEN_GAMMA, ddof=0, eps=OAT_EPS)[1:]
    assert not np.allclose(got, with_partial, atol=1e-3)  # the aborted episode's first turn would have moved them


def test_a_step_whose_every_episode_failed_says_so(reference, tokenizer):
    specs = _specs()[:1]
    actor = make_actor(tokenizer, specs, max_tokens=GOLDEN_PARAMS.max_tokens)
    actor.llm.generate = _aborting(actor.llm, {tuple(reference.trajectories[0].context_ids(0))})
    with pytest.raises(RuntimeError, match=r"no GEM episode of this step \(1\) can be trained on: 1 failed on the infrastructure \(e\.g\. "):
        actor.step()


def test_the_gem_flags_apply_to_dataset_rows_where_a_row_sets_none(tmp_path, tokenizer):
    """--gem-max-turns, --gem-max-context-tokens and --gem-system-prompt with --gem-dataset: each fills what
    a row leaves unset (a row's own value wins), and the actor's episodes play under them."""
    import json

    from gem_integrations.oat.dataset import TASK_KEY
    from gem_integrations.oat.rollout import TaskCycle

    rows = [
        TaskSpec("game:GuessTheNumber-v0", seed=1),  # 5 turns unbounded: the flags' 2 turns
        TaskSpec("game:GuessTheNumber-v0", seed=1, max_turns=3, system_prompt="Row prompt."),  # its own
        TaskSpec("game:GuessTheNumber-v0", seed=1, max_turns=10),  # contexts 98, 175, 223, 271: the flag's 250 cuts it
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({TASK_KEY: spec.to_json()}) + "\n" for spec in rows))
    actor = make_actor(tokenizer, rows, max_tokens=GOLDEN_PARAMS.max_tokens)
    actor.args = gem_args(
        gem_dataset=str(path),
        gem_max_turns=2,
        gem_max_context_tokens=250,
        gem_system_prompt="Flag prompt.",
        generate_max_length=GOLDEN_PARAMS.max_tokens,
        gem_episodes_per_step=len(rows),
    )
    actor.gem_tasks = TaskCycle.from_args(actor.args)
    specs = actor.gem_tasks.take(3)
    assert [(s.max_turns, s.max_context_tokens, s.system_prompt) for s in specs] == [
        (2, 250, "Flag prompt."),
        (3, 250, "Row prompt."),
        (10, 250, "Flag prompt."),
    ]
    actor.gem_tasks = TaskCycle.from_args(actor.args)
    episodes = actor.step()
    assert [len(e) for e in episodes] == [2, 3, 3]
    assert [e[-1].info["gem/context_limit"] for e in episodes] == [0.0, 0.0, 1.0]
    assert ["Flag prompt." in episodes[0][0].prompt, "Row prompt." in episodes[1][0].prompt, "Flag prompt." in episodes[2][0].prompt] == [True] * 3
    assert all(len(x.prompt_ids) + len(x.response_ids) <= 250 for e in episodes for x in e)


def test_the_context_is_capped_at_the_engines_window_and_a_refusal_ends_that_episode_alone(tokenizer):
    """No cap set anywhere: the engine's max_model_len is the cap, so no prompt reaches vLLM's refusal (a
    batch vLLM refuses fails every episode in it). A row whose own cap is past the window: its prompt that
    leaves no room in the window is refused alone; that episode ends as the runner's context limit
    (truncated, not an infra failure) and the others of the same batches play on."""
    import asyncio

    from gem_core.plugins import sampling_from_vllm
    from gem_core.testing.vllm_engine import EngineError
    from gem_integrations.oat.rollout import OatEnginePolicy, play

    window = 300
    specs = [
        TaskSpec("game:GuessTheNumber-v0-easy", seed=0),  # 4 turns, 227 tokens: all of it
        TaskSpec("game:GuessTheNumber-v0", seed=1),  # a 5th turn would start at 304
        TaskSpec("game:Mastermind-v0-hard", seed=11, max_context_tokens=1000),  # its own cap: the 3rd prompt (302) is refused
    ]
    actor = make_actor(tokenizer, specs, max_tokens=GOLDEN_PARAMS.max_tokens, max_model_len=window)
    episodes = actor.step()
    assert [len(e) for e in episodes] == [4, 4, 2]
    assert [e[-1].info["gem/context_limit"] for e in episodes] == [0.0, 1.0, 1.0]
    assert [e[-1].info["gem/truncated"] for e in episodes] == [0.0, 1.0, 1.0]
    assert all(x.info["gem/infra_failed_episodes"] == 0.0 for e in episodes for x in e)
    assert max(len(ids) for ids, _ in actor.llm.engine.requests) < window  # vLLM never had to refuse a batch

    # a policy that does not know the window: vLLM refuses the batch, which is split until the refusal is alone
    policy = OatEnginePolicy(actor.generate, actor.sampling_params)
    params = sampling_from_vllm(actor.sampling_params, actor.sampling_params.max_tokens)
    trajectories = asyncio.run(play(specs, policy, tokenizer, params))
    assert [(t.num_turns, t.truncation_reason, t.infra_error) for t in trajectories] == [
        (4, None, None),
        (4, "context_limit", None),
        (2, "context_limit", None),
    ]
    assert [len(e) for e in episodes] == [t.num_turns for t in trajectories]
    assert 1 in policy.batches  # the refused batches were split down to the refused prompt
    with pytest.raises(EngineError, match="maximum context length is 300 tokens"):  # the refusal the policy met
        actor.llm.generate(prompt_token_ids=[[1] * 301], sampling_params=actor.sampling_params)


def test_a_row_that_stops_at_the_move_sends_the_brace_stops_through_oats_actor(tokenizer):
    # rollout.stop_after_box rides in the row's task spec (make-dataset oat --stop-after-box): every request oat's
    # actor step sends to vLLM carries the closing-brace stop ids; a row without it, none
    from gem_core.rollout.policy import closing_brace_ids

    braces = set(closing_brace_ids(tokenizer))
    episode = next(e for e in GOLDEN_EPISODES if e.env_id.startswith("game:GuessTheNumber"))
    for on in (True, False):
        spec = TaskSpec(episode.env_id, seed=episode.seed, max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS, stop_after_box=on)
        actor = make_actor(tokenizer, [spec], max_tokens=GOLDEN_PARAMS.max_tokens)
        assert actor.step()
        stops = [set(params.stop_token_ids or ()) for _, params in actor.llm.engine.requests]
        assert stops and all((braces <= s) if on else not (braces & s) for s in stops), (on, stops)
