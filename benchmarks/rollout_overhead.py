"""Rollout overhead: tokenizer work per episode against episode length, and runner time per turn.

    python benchmarks/rollout_overhead.py [--turns 5,10,20,50] [--episodes 64] [--markdown out.md]

Table 1, tokenizer work per episode (GuessTheNumber, 1..10^6, exactly N turns, the same guesses):

* ``gem-core``: the episode runner with token deltas. It tokenises the first prompt, then one
  observation delta per turn; the model's tokens are never re-tokenised. Characters tokenised per
  episode grow linearly with the number of turns.
* ``re-template``: GEM's approach on the same env and tokenizer: re-render the whole history with the
  chat template every turn and tokenise it (quadratic).
* ``gem-llm``: gem-llm's own ``ObservationWrapper(include_chat_template=True)`` on gem-llm's env (its
  text differs slightly), each turn's observation tokenised as its trainers do. ``n/a`` when gem-llm
  (import name ``gem``) is not installed in this interpreter (``pip install -e '.[bench]'``).

"chars" are characters handed to the tokenizer per episode, "ms" the time spent in chat templating
plus tokenising per episode, "chars/turn" shows the growth.

Table 2, runner overhead per turn, excluding generation: episodes played with a policy that returns
precomputed tokens at once; env step time is measured and subtracted. It covers the chat-template
delta, decoding the response for the env, bookkeeping and the thread hop of ``env.step``
(``step_in_thread=True``: always; ``"auto"``, the default: only for envs whose steps are not all fast;
``False``: never). Target: under 1 ms per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import gem_core
from gem_core.rollout import ChatFormatter, Generation, RunConfig, SamplingParams, run_episodes
from gem_core.testing import build_test_tokenizer

RANGE = (1, 1_000_000)


class CountingTokenizer:
    """A tokenizer proxy that counts the characters it is asked to tokenise and the time it spends
    templating and tokenising."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.chars = 0
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def reset(self) -> None:
        self.chars, self.seconds = 0, 0.0

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        started = time.perf_counter()
        ids = self.inner.encode(text, **kwargs)
        self.seconds += time.perf_counter() - started
        self.chars += len(text)
        return ids

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.inner.apply_chat_template(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        return out

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust tokenizer (ChatFormatter calls it directly), counted the same way."""
        backend = getattr(self.inner, "backend_tokenizer", None)
        return None if backend is None else _CountingBackend(backend, self)


class _CountingBackend:
    def __init__(self, inner: Any, counter: CountingTokenizer):
        self.inner, self.counter = inner, counter

    def encode(self, text: str, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.inner.encode(text, **kwargs)
        self.counter.seconds += time.perf_counter() - started
        self.counter.chars += len(text)
        return out

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return self.inner.decode(ids, **kwargs)


def guess(turn: int) -> str:
    """The scripted action of a turn (the same for every implementation)."""
    return f"I guess \\boxed{{{turn + 1}}}."


class InstantPolicy:
    """Returns precomputed tokens at once (no decoding of the context): generation costs nothing."""

    def __init__(self, tokenizer: Any, end_id: int, max_turns: int):
        self.responses = [tokenizer.encode(guess(t), add_special_tokens=False) + [end_id] for t in range(max_turns)]

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        turn = int(request_id.rsplit("-", 1)[1])
        ids = self.responses[turn]
        return Generation(list(ids), [0.0] * len(ids), "stop")


class TimedEnv(gem_core.Wrapper):
    """Accumulates the time spent in the inner env's step and reset."""

    seconds = 0.0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        started = time.perf_counter()
        try:
            return self.env.reset(seed=seed, options=options)
        finally:
            TimedEnv.seconds += time.perf_counter() - started

    def step(self, action: str) -> Any:
        started = time.perf_counter()
        try:
            return self.env.step(action)
        finally:
            TimedEnv.seconds += time.perf_counter() - started


def make_env(turns: int) -> gem_core.Env:
    return gem_core.make("game:GuessTheNumber-v0", min_number=RANGE[0], max_number=RANGE[1], max_turns=turns)


# -- table 1 ------------------------------------------------------------------------------------------------


def gem_core_tokenizer_work(tokenizer: Any, turns: int, episodes: int) -> tuple[float, float, float]:
    """(chars, ms, turns) per episode through the runner's token deltas."""
    counting = CountingTokenizer(tokenizer)
    formatter = ChatFormatter(counting)
    policy = InstantPolicy(tokenizer, formatter.end_of_turn_id, turns)
    counting.reset()
    envs = [make_env(turns) for _ in range(episodes)]
    trajectories = asyncio.run(
        run_episodes(envs, policy, formatter, RunConfig(params=SamplingParams(max_tokens=32), step_in_thread=False), seeds=list(range(episodes)))
    )
    played = sum(t.num_turns for t in trajectories) / episodes
    return counting.chars / episodes, 1e3 * counting.seconds / episodes, played


def retemplate_tokenizer_work(tokenizer: Any, turns: int, episodes: int) -> tuple[float, float, float]:
    """(chars, ms, turns) per episode when the whole history is re-templated and tokenised every turn."""
    counting = CountingTokenizer(tokenizer)
    total_turns = 0
    for seed in range(episodes):
        env = make_env(turns)
        observation, _ = env.reset(seed=seed)
        messages = [{"role": "user", "content": observation}]
        for turn in range(turns):
            prompt = counting.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            counting.encode(prompt, add_special_tokens=False)
            action = guess(turn)
            observation, _, terminated, truncated, _ = env.step(action)
            total_turns += 1
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
            if terminated or truncated:
                break
    return counting.chars / episodes, 1e3 * counting.seconds / episodes, total_turns / episodes


def gem_llm_tokenizer_work(gem: Any, tokenizer: Any, turns: int, episodes: int) -> tuple[float, float, float]:
    """(chars, ms, turns) per episode with gem-llm's ObservationWrapper and its env."""
    from gem.wrappers.observation_wrapper import ObservationWrapper

    counting = CountingTokenizer(tokenizer)
    total_turns = 0
    for seed in range(episodes):
        env = gem.make("game:GuessTheNumber-v0-hard", min_number=RANGE[0], max_number=RANGE[1], max_turns=turns)
        wrapped = ObservationWrapper(env, include_action=True, include_chat_template=True, tokenizer=counting)
        observation, _ = wrapped.reset(seed=seed)
        for turn in range(turns):
            counting.encode(observation, add_special_tokens=False)  # the trainer tokenises each prompt
            observation, _, terminated, truncated, _ = wrapped.step(guess(turn))
            total_turns += 1
            if terminated or truncated:
                break
    return counting.chars / episodes, 1e3 * counting.seconds / episodes, total_turns / episodes


# -- table 2 ------------------------------------------------------------------------------------------------


def runner_overhead(tokenizer: Any, turns: int, episodes: int, step_in_thread: bool | str, concurrency: int) -> tuple[float, float]:
    """(microseconds of runner time per turn, excluding env and generation; env microseconds per turn)."""
    formatter = ChatFormatter(tokenizer)
    policy = InstantPolicy(tokenizer, formatter.end_of_turn_id, turns)
    envs = [TimedEnv(make_env(turns)) for _ in range(concurrency)]
    TimedEnv.seconds = 0.0
    started = time.perf_counter()
    trajectories = asyncio.run(
        run_episodes(envs, policy, formatter, RunConfig(params=SamplingParams(max_tokens=32), step_in_thread=step_in_thread), seeds=list(range(episodes)))
    )
    elapsed = time.perf_counter() - started
    played = sum(t.num_turns for t in trajectories)
    return 1e6 * (elapsed - TimedEnv.seconds) / played, 1e6 * TimedEnv.seconds / played


def _peer() -> Any | None:
    try:
        import gem  # gem-llm, the reference implementation
    except Exception:
        return None
    return gem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="5,10,20,50", help="episode lengths (comma-separated)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per measurement")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    turn_counts = [int(t) for t in args.turns.split(",")]
    tokenizer = build_test_tokenizer("qwen3")
    gem = _peer()
    for warm in (gem_core_tokenizer_work, retemplate_tokenizer_work):  # template compilation, caches
        warm(tokenizer, 2, 1)

    lines = ["## Tokenizer work per episode (GuessTheNumber, the same guesses)", ""]
    lines.append(
        "| turns | gem-core chars | gem-core ms | gem-core chars/turn | re-template chars | re-template ms | re-template chars/turn | gem-llm chars | gem-llm ms | gem-llm chars/turn |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ours_per_turn, theirs_per_turn = [], []
    for turns in turn_counts:
        ours = gem_core_tokenizer_work(tokenizer, turns, args.episodes)
        retemplate = retemplate_tokenizer_work(tokenizer, turns, args.episodes)
        peer = gem_llm_tokenizer_work(gem, tokenizer, turns, args.episodes) if gem is not None else None
        ours_per_turn.append(ours[0] / ours[2])
        theirs_per_turn.append(retemplate[0] / retemplate[2])
        peer_cells = ["n/a"] * 3 if peer is None else [f"{peer[0]:,.0f}", f"{peer[1]:.2f}", f"{peer[0] / peer[2]:,.0f}"]
        lines.append(
            f"| {turns} | {ours[0]:,.0f} | {ours[1]:.2f} | {ours[0] / ours[2]:,.0f} | {retemplate[0]:,.0f} | {retemplate[1]:.2f} | "
            f"{retemplate[0] / retemplate[2]:,.0f} | " + " | ".join(peer_cells) + " |"
        )
    growth_ours = ours_per_turn[-1] / ours_per_turn[0]
    growth_theirs = theirs_per_turn[-1] / theirs_per_turn[0]
    lines += [
        "",
        f"chars/turn from {turn_counts[0]} to {turn_counts[-1]} turns: gem-core x{growth_ours:.2f} (linear work per episode: "
        f"{'yes' if growth_ours < 1.5 else 'NO'}), re-templating x{growth_theirs:.2f} (quadratic).",
        "",
        "## Runner overhead per turn, excluding generation and env time",
        "",
        "| turns | episodes in flight | step_in_thread | runner us/turn | env us/turn | under 1 ms |",
        "|---:|---:|:---:|---:|---:|:---:|",
    ]
    for turns in (turn_counts[0], turn_counts[-1]):
        for concurrency in (1, 64):
            for mode in (True, "auto", False):
                episodes = max(args.episodes, concurrency)
                runner_us, env_us = runner_overhead(tokenizer, turns, episodes, mode, concurrency)
                lines.append(f"| {turns} | {concurrency} | {mode} | {runner_us:.0f} | {env_us:.0f} | {'yes' if runner_us < 1000 else 'NO'} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
