"""Policies: scripted, random, a tiny local transformers model (CPU, end to end), an OpenAI-compatible
chat endpoint (a local fake server)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from rollout_envs import ScriptedRewardEnv

import gem_core
from gem_core.rollout import (
    RunConfig,
    ChatFormatter,
    EpisodeSpec,
    Generation,
    OpenAIPolicy,
    RandomPolicy,
    SamplingParams,
    ScriptedPolicy,
    run_episode,
    run_episodes,
)
from gem_core.testing.golden import golden_respond
from gem_core.testing import FakeChatServer


def _generate(policy, prompt, params, request_id="r/turn-0"):
    return asyncio.run(policy.generate(prompt, params, request_id=request_id))


def test_sampling_params_and_generation_validate():
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    params = SamplingParams(max_tokens=5, stop_token_ids=[1, 2], extra={"repetition_penalty": 1.1})
    assert params.stop_token_ids == (1, 2)
    assert params.to_dict()["repetition_penalty"] == 1.1 and params.to_dict()["stop_token_ids"] == [1, 2]
    with pytest.raises(ValueError, match="logprobs"):
        Generation([1, 2], [0.0], "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        Generation([1], None, "eos")  # type: ignore[arg-type]


def test_scripted_policy_stops_or_is_cut(tokenizer):
    policy = ScriptedPolicy(tokenizer, lambda context: "short" if "cut" not in context else "a much longer answer here")
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    short = _generate(policy, tokenizer.encode("hi"), SamplingParams(max_tokens=8, stop_token_ids=(stop,)))
    assert short.finish_reason == "stop" and short.token_ids[-1] == stop
    assert tokenizer.decode(short.token_ids[:-1]) == "short"
    cut = _generate(policy, tokenizer.encode("cut"), SamplingParams(max_tokens=3, stop_token_ids=(stop,)))
    assert cut.finish_reason == "length" and len(cut.token_ids) == 3 and stop not in cut.token_ids


def test_random_policy_streams_follow_the_request_id(tokenizer):
    policy = RandomPolicy(len(tokenizer), seed=5, stop_probability=0.1)
    params = SamplingParams(max_tokens=30, stop_token_ids=(7,))
    a = _generate(policy, [1], params, "ep/turn-0")
    assert _generate(policy, [1, 2, 3], params, "ep/turn-0").token_ids == a.token_ids  # the prompt does not matter
    assert _generate(policy, [1], params, "ep/turn-1").token_ids != a.token_ids
    assert len(a.token_ids) <= 30 and 7 not in a.token_ids[:-1]
    assert (a.finish_reason == "stop") == (a.token_ids[-1] == 7)


# -- an OpenAI-compatible chat endpoint -----------------------------------------------------------------------


def _chat_reply(messages):
    """golden_respond over the messages rendered ChatML-style (it reads the user turns)."""
    return golden_respond("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages))


def test_openai_policy_plays_text_episodes(tokenizer):
    formatter = ChatFormatter(tokenizer, system_prompt="Answer with a boxed move.")
    with FakeChatServer(_chat_reply) as server:
        policy = OpenAIPolicy(server.base_url, "fake-model", api_key="test-key")
        specs = [EpisodeSpec("game:GuessTheNumber-v0-easy", seed=s) for s in range(3)]
        trajectories = asyncio.run(run_episodes(specs, policy, formatter, RunConfig(params=SamplingParams(max_tokens=200))))
        requests = list(server.requests)
    for trajectory in trajectories:
        assert trajectory.terminated and trajectory.rewards[-1] == 1.0  # binary search wins
        assert not trajectory.token_mode and trajectory.messages[0] == {"role": "system", "content": "Answer with a boxed move."}
        assert trajectory.messages[-1]["role"] == "assistant"
        assert len(trajectory.messages) == 2 + 2 * trajectory.num_turns - 1
    assert sum(t.num_turns for t in trajectories) == len(requests)
    assert {r["request_id"] for r in requests} >= {"ep0/turn-0", "ep1/turn-0", "ep2/turn-0"}
    assert all(r["body"]["model"] == "fake-model" and r["body"]["max_tokens"] == 200 for r in requests)


def test_openai_policy_length_and_context_errors(tokenizer):
    with FakeChatServer(lambda messages: "x" * 50 + " \\boxed{3}", context_chars=1200) as server:
        policy = OpenAIPolicy(server.base_url, "fake")
        env = ScriptedRewardEnv([0.1] * 50, obs_chars=200)
        trajectory = asyncio.run(run_episode(env, policy, None, RunConfig(params=SamplingParams(max_tokens=20)), seed=0))
    assert trajectory.turns[0].finish_reason == "length" and trajectory.turns[0].response_text == "x" * 20
    assert trajectory.truncation_reason == "context_limit"
    assert 1 <= trajectory.num_turns < 50 and trajectory.rewards == [0.1] * trajectory.num_turns


def test_openai_policy_keeps_max_concurrency_requests_in_flight():
    """asyncio's default thread pool (at most 32 threads, a few per core) must not cap the requests in
    flight below max_concurrency: 40 slow answers at once all wait on the server together."""
    lock, state = threading.Lock(), {"now": 0, "peak": 0}
    release = threading.Event()

    def slow(messages):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            if state["now"] == 40:
                release.set()
        release.wait(2)
        with lock:
            state["now"] -= 1
        return "\\boxed{1}"

    async def many(policy):
        params = SamplingParams(max_tokens=50)
        return await asyncio.gather(*(policy.chat([{"role": "user", "content": "go"}], params, request_id=f"e{i}/turn-0") for i in range(40)))

    with FakeChatServer(slow) as server:
        policy = OpenAIPolicy(server.base_url, "fake", max_concurrency=40)
        try:
            answers = asyncio.run(many(policy))
        finally:
            policy.close()
    assert state["peak"] == 40 and all(a.text == "\\boxed{1}" for a in answers)
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m", max_concurrency=0)


# -- a tiny local transformers model, end to end on CPU ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gem_core.testing import build_tiny_model

    return build_tiny_model(len(tokenizer), seed=0)


def test_hf_policy_end_to_end_on_cpu(tokenizer, formatter, tiny_model):
    """A random tiny model plays multi-turn episodes; its logprobs match a teacher-forced forward pass
    over the very tokens of the sequence view, and a rerun is identical."""
    import torch

    from gem_core.rollout import HFPolicy

    params = SamplingParams(max_tokens=12, temperature=1.0)
    envs = [ScriptedRewardEnv([0.0, 0.5, 1.0], obs_chars=30) for _ in range(3)]
    policy = HFPolicy(tiny_model, seed=0, max_batch_size=1)
    first = asyncio.run(run_episodes(envs, policy, formatter, RunConfig(params=params, max_context_tokens=200), seeds=[0, 1, 2]))
    again = asyncio.run(
        run_episodes(envs, HFPolicy(tiny_model, seed=0, max_batch_size=1), formatter, RunConfig(params=params, max_context_tokens=200), seeds=[0, 1, 2])
    )
    assert [t.to_dict() for t in first] == [t.to_dict() for t in again]
    assert sum(t.num_turns for t in first) >= 4
    for trajectory in first:
        sequence = trajectory.as_sequence()
        assert len(sequence.input_ids) <= 200
        ids = torch.tensor([sequence.input_ids])
        with torch.inference_mode():
            logp = torch.log_softmax(tiny_model(ids).logits[0].float(), dim=-1)
        start = len(sequence.prompt_ids)
        for k, (token, mask, logprob) in enumerate(zip(sequence.response_ids, sequence.loss_mask, sequence.logprobs)):
            if mask:
                assert logprob == pytest.approx(float(logp[start + k - 1, token]), abs=1e-4)
        for turn in trajectory.turns:
            assert turn.finish_reason in ("stop", "length")
            assert len(turn.response_ids) <= params.max_tokens


def test_hf_policy_batches_concurrent_requests(tokenizer, formatter, tiny_model):
    from gem_core.rollout import HFPolicy

    policy = HFPolicy(tiny_model, seed=3, max_batch_size=4)
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("hi", "a longer prompt than that", "mid size")]
    params = SamplingParams(max_tokens=6, stop_token_ids=(formatter.end_of_turn_id,))
    batched = policy.generate_batch(prompts, params, ["a", "b", "c"])
    single = [policy.generate_batch([p], params, [rid])[0] for p, rid in zip(prompts, ["a", "b", "c"])]
    for x, y in zip(batched, single):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    assert policy.generate_batch(prompts[:1], greedy, ["x"])[0].token_ids == policy.generate_batch(prompts[:1], greedy, ["y"])[0].token_ids
    trajectories = asyncio.run(
        run_episodes([EpisodeSpec("game:Mastermind-v0-easy", seed=s) for s in range(4)], policy, formatter, RunConfig(params=SamplingParams(max_tokens=8)))
    )
    assert all(t.done and t.num_turns >= 1 for t in trajectories)


def test_the_cache_keyword_is_the_models_own_name_for_it(tokenizer, tiny_model):
    """transformers 5.2x renamed the forward's ``past_key_values`` to ``cache`` (the old name warns): the
    policy passes whichever the model's forward names, and generates without that warning."""
    import inspect
    import warnings

    from gem_core.rollout import HFPolicy
    from gem_core.rollout.policies import cache_keyword

    names = inspect.signature(tiny_model.forward).parameters
    assert cache_keyword(tiny_model) == ("cache" if "cache" in names else "past_key_values")

    class OldModel:
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            return None

    assert cache_keyword(OldModel()) == "past_key_values"
    assert cache_keyword(object()) == "past_key_values"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        prompts = [tokenizer.encode("a shared instruction for every row " * 4) + [i] for i in range(2)]
        HFPolicy(tiny_model, seed=1, max_batch_size=2).generate_batch(prompts, SamplingParams(max_tokens=3), ["r0", "r1"])


def test_hf_policy_runs_a_shared_prompt_prefix_once(tokenizer, tiny_model):
    """Prompts that start alike (episodes on one instruction, some a turn further): the common prefix goes
    through the model once, as one row, and every request's tokens and logprobs are those of the plain
    batch (and of a batch of its own), greedy and sampled."""
    from gem_core.rollout import HFPolicy
    from gem_core.rollout.policies import MIN_SHARED_PREFIX

    instruction = tokenizer.encode("You are playing a game. Guess a number from 1 to 10; reply with one.", add_special_tokens=False)
    assert len(instruction) > MIN_SHARED_PREFIX
    prompts = [instruction] * 2 + [instruction + tokenizer.encode(f" {n}. Higher, try again:", add_special_tokens=False) for n in (3, 5, 12)]
    ids = ["a", "b", "c", "d", "e"]
    shapes = []
    handle = tiny_model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        for params in (SamplingParams(max_tokens=6, temperature=0.0), SamplingParams(max_tokens=6, temperature=1.0)):
            shapes.clear()
            shared = HFPolicy(tiny_model, seed=1, max_batch_size=8).generate_batch(prompts, params, ids)
            assert shapes[0] == (1, len(instruction) - 1)  # the prefix, once (each prompt keeps a token of its own)
            plain = HFPolicy(tiny_model, seed=1, max_batch_size=8, share_prefix=False).generate_batch(prompts, params, ids)
            alone = [HFPolicy(tiny_model, seed=1).generate_batch([p], params, [i])[0] for p, i in zip(prompts, ids)]
            for x, y, z in zip(shared, plain, alone):
                assert x.token_ids == y.token_ids == z.token_ids
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
                assert x.logprobs == pytest.approx(z.logprobs, abs=1e-4)
    finally:
        handle.remove()


def test_hf_policy_from_a_saved_model(tmp_path, tokenizer, tiny_model):
    from gem_core.rollout import HFPolicy

    tiny_model.save_pretrained(tmp_path)
    loaded = HFPolicy.from_pretrained(str(tmp_path), seed=0)
    original = HFPolicy(tiny_model, seed=0)
    params = SamplingParams(max_tokens=5)
    prompt = tokenizer.encode("hello", add_special_tokens=False)
    assert loaded.generate_batch([prompt], params, ["q"])[0].token_ids == original.generate_batch([prompt], params, ["q"])[0].token_ids
    env = gem_core.make("game:GuessTheNumber-v0-easy")
    trajectory = asyncio.run(run_episode(env, loaded, ChatFormatter(tokenizer), RunConfig(params=params), seed=0))
    assert trajectory.done


class _JitteryEnv(ScriptedRewardEnv):
    """A ScriptedRewardEnv whose episode with seed s lasts 2 + s % 3 turns and whose steps take a random few
    milliseconds (a stream of its own, apart from the env's seeded one), so the episodes' requests reach the
    policy in another order on every run. Every env of a pool alike: an episode's course is its seed's."""

    def __init__(self, jitter_seed: int):
        import random

        super().__init__([0.0, 0.5, 0.0, 1.0], obs_chars=12)
        self._jitter = random.Random(jitter_seed)

    def reset(self, seed=None, options=None):
        self.rewards = [0.0, 0.5, 0.0, 1.0][: 2 + (seed or 0) % 3]
        return super().reset(seed=seed, options=options)

    def step(self, action):
        import time

        time.sleep(self._jitter.random() * 0.004)
        return super().step(action)


def _hf_episodes(tiny_model, formatter, *, jitter_seed: int, hide_cohort: bool = False, reuse_cache: bool = True, temperature: float = 1.0, record=None):
    from gem_core.rollout import HFPolicy

    policy = HFPolicy(tiny_model, seed=0, max_batch_size=4, reuse_cache=reuse_cache)
    if record is not None:
        original = policy._generate_batch

        def recorded(batch):
            record.append([r.request_id for r in batch])
            return original(batch)

        policy._generate_batch = recorded
    if hide_cohort:  # a policy the runner cannot tell when episodes end: batches as requests arrive
        policy.open_cohort = None
    envs = [_JitteryEnv(jitter_seed * 100 + i) for i in range(6)]
    params = SamplingParams(max_tokens=6, temperature=temperature)
    config = RunConfig(params=params, max_context_tokens=400, step_in_thread=True)
    return asyncio.run(run_episodes(envs, policy, formatter, config, seeds=list(range(7)), max_concurrency=5))


def test_hf_policy_rounds_make_a_rerun_identical_whatever_the_timing(formatter, tiny_model):
    """Under run_episodes the policy cuts a batch when every episode in play has asked (a round), in request-id
    order: 7 episodes, 5 at a time, batches of 4, env steps of random length in threads. Reruns under other
    timings give the same tokens and the same logprobs, bit for bit; each round holds every episode in play."""
    rounds: list[list[str]] = []
    runs = [_hf_episodes(tiny_model, formatter, jitter_seed=seed, record=rounds if seed == 0 else None) for seed in range(3)]
    dumps = [[(turn.response_ids, turn.logprobs) for t in run for turn in t.turns] for run in runs]
    assert dumps[0] == dumps[1] == dumps[2]
    assert sum(t.num_turns for t in runs[0]) >= 14
    # the first round: the 5 episodes in play, in request-id order, cut into batches of 4 and 1
    assert rounds[0] == sorted(rounds[0]) and len(rounds[0]) == 4 and len(rounds[1]) == 1
    assert all(len(batch) <= 4 for batch in rounds)
    assert sorted(rounds[0] + rounds[1]) == [f"ep{g}/turn-0" for g in range(5)]


def test_hf_policy_episode_cache_gives_the_numbers_of_a_whole_context(formatter, tiny_model):
    """Each episode's keys and values kept between its turns (only the tokens a turn adds are run) give the
    tokens of running each whole context again, and logprobs within float rounding, greedy and sampled."""
    for temperature in (0.0, 1.0):
        kept = _hf_episodes(tiny_model, formatter, jitter_seed=0, temperature=temperature)
        whole = _hf_episodes(tiny_model, formatter, jitter_seed=0, temperature=temperature, reuse_cache=False)
        assert [[turn.response_ids for turn in t.turns] for t in kept] == [[turn.response_ids for turn in t.turns] for t in whole]
        for a, b in zip(kept, whole):
            for x, y in zip(a.turns, b.turns):
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


class _InstructionFirstEnv(ScriptedRewardEnv):
    """Every episode's first message starts with one long instruction; its seed comes at the end."""

    def reset(self, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return "Read these rules with care before you answer: " + "z" * 40 + f" (episode {seed})", info


def test_hf_policy_episode_cache_runs_only_the_new_tokens(formatter, tiny_model):
    """With the cache kept, a turn after the first feeds the model only what its context gained, and an episode
    that starts in a later round (5 episodes, 2 at a time) starts from the instruction run in the first round:
    after the first round's prefix, no forward is wider than a turn's delta, though contexts grow far wider."""
    from gem_core.rollout import HFPolicy

    shapes: list[tuple[int, int]] = []
    handle = tiny_model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        envs = [_InstructionFirstEnv([0.0, 0.0, 0.0, 1.0], obs_chars=40) for _ in range(2)]
        policy = HFPolicy(tiny_model, seed=0, max_batch_size=2)
        config = RunConfig(params=SamplingParams(max_tokens=4, temperature=0.0), max_context_tokens=600)
        trajectories = asyncio.run(run_episodes(envs, policy, formatter, config, seeds=[0, 1, 2, 3, 4]))
    finally:
        handle.remove()
    last_context = max(t.turns[-1].context_len for t in trajectories)
    delta = max(len(turn.obs_delta_ids) for t in trajectories for turn in t.turns) + 1
    first_prompt = len(trajectories[0].prompt_ids)
    assert shapes[0][0] == 1 and first_prompt - 16 < shapes[0][1] < first_prompt  # the instruction, once
    later = [width for _, width in shapes[1:]]
    assert len(later) > 20 and max(later) <= delta  # episodes 2-4 start from it too
    assert last_context > 3 * delta
    assert policy._episode_caches == {} and policy._prefix is None  # dropped as each episode ended, and at the end


def test_hf_policy_cache_of_another_kind_gives_the_same_numbers(formatter, tiny_model, monkeypatch):
    """A model whose cache cannot be laid out ahead (a sliding window, other layer kinds: ``cache_shape`` None)
    takes transformers' own cache, grown by concatenation: the same tokens and logprobs within float rounding."""
    import gem_core.rollout.hf_policy as hf_policy

    laid_out = _hf_episodes(tiny_model, formatter, jitter_seed=0, temperature=0.0)
    asked = []
    monkeypatch.setattr(hf_policy, "cache_shape", lambda model: asked.append(model))  # None, where HFPolicy looks it up
    grown = _hf_episodes(tiny_model, formatter, jitter_seed=0, temperature=0.0)
    assert asked  # the patch reached the policy
    assert [[turn.response_ids for turn in t.turns] for t in laid_out] == [[turn.response_ids for turn in t.turns] for t in grown]
    for a, b in zip(laid_out, grown):
        for x, y in zip(a.turns, b.turns):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_a_growing_cache_past_its_capacity_grows_by_concatenation():
    """The in-place cache holds the past and every update in order; an update past its buffer's capacity is
    appended as transformers' own layer would, nothing lost."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gem_core.rollout.policies import growing_cache

    buffers = torch.zeros(2, 2, 1, 3, 4, 5)  # layers, keys/values, batch, heads, capacity 4, dim
    buffers[:, :, :, :, :1] = 7.0  # a past of one position
    cache = growing_cache(buffers, 1)
    assert cache.get_seq_length() == 1
    first = torch.ones(1, 3, 2, 5)
    keys, values = cache.update(first, 2 * first, 0)
    assert keys.shape[-2] == 3 and bool((keys[..., 0, :] == 7).all()) and bool((values[..., 1:, :] == 2).all())
    assert bool((buffers[0, 0, :, :, 1:3] == 1).all())  # written in place, in the buffer
    more = 3 * torch.ones(1, 3, 2, 5)
    keys, values = cache.update(more, more, 0)  # 5 positions: past the capacity of 4
    assert keys.shape[-2] == 5 and bool((keys[..., :1, :] == 7).all()) and bool((keys[..., 1:3, :] == 1).all()) and bool((keys[..., 3:, :] == 3).all())
