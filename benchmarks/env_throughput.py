"""Env throughput: steps/s and resets/s per game, and vector env steps/s, against gem-llm in the same run.

    python benchmarks/env_throughput.py [--seconds 0.5] [--games Sudoku,Wordle] [--markdown out.md]
    nox -s bench          # installs gem-llm (the peer) beside gem-core and runs this

Only ``env.step``/``env.reset`` are timed; random actions are drawn outside the timer, for both
implementations, so the numbers compare the envs and not the action samplers. The two implementations
take turns call by call (``interleaved``), so a drift in the machine's speed hits both alike. gem-llm is imported in the
same process when it is installed (import name ``gem``); otherwise its columns read "n/a".
The CPU-bound vector row uses ``bench:CpuBound-v0`` (defined here): a step that burns ``work_ms`` of
pure-Python CPU, which is what an env with a real checker (code tests, math grading) looks like.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import gem_core
from gem_core.envs.games import GAME_NAMES

VARIANTS = ("easy", "hard")
# Games on which the peer steps on gem-core's actions although it has a sampler, because its own would
# not make a fair workload (gem-llm 0.1.0, checked by stepping them):
# - FifteenPuzzle, Crosswords, WordSearch: its sampler writes a move its own step cannot read (no
#   \boxed{}, or brackets inside it), so every one of its steps is a format error that ends the episode;
# - Wordle: its guesses come from NLTK's word list, which offline is our stand-in (_offline_nltk_words),
#   whose 17 three-letter words made a quarter of its Wordle-easy steps repeats (a cheap path).
SHARED_ACTIONS = {
    "FifteenPuzzle": "its sampler's moves lack \\boxed{}, so each of its steps would be a format error",
    "Crosswords": "its sampler's moves have brackets its parser rejects (format errors)",
    "WordSearch": "its sampler's moves have brackets its parser rejects (format errors)",
    "Wordle": "its guesses come from the offline stand-in for NLTK's word list, too small a vocabulary",
}
NUM_VECTOR_ENVS = 64


if "bench:CpuBound-v0" not in gem_core.registry.registry:
    # A class defined in a script lives in __main__, which worker processes cannot import by name.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    gem_core.register("bench:CpuBound-v0", "cpu_bound_env:CpuBound", description="benchmark: 1 ms of CPU per step")


def _offline_nltk_words() -> None:
    """gem-llm's word games read NLTK's ``words`` corpus, a download. Offline we hand it a local corpus
    made from the same english-words data gem-core uses: ``en`` (all words) and ``en-basic`` (a stand-in
    for Ogden's 850 Basic English words: an even spread of ~630 common 3-8 letter words). Speed only."""
    if os.environ.get("NLTK_DATA"):
        return
    import tempfile

    from gem_core.utils.words import word_set

    root = os.path.join(tempfile.gettempdir(), "gem_core_bench_nltk_data")
    folder = os.path.join(root, "corpora", "words")
    if not os.path.exists(os.path.join(folder, "en-basic")):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "en"), "w") as fh:
            fh.write("\n".join(sorted(word_set("all"))) + "\n")
        basic = [w for w in sorted(word_set("common")) if 3 <= len(w) <= 8][::60][:850]
        with open(os.path.join(folder, "en-basic"), "w") as fh:
            fh.write("\n".join(basic) + "\n")
    os.environ["NLTK_DATA"] = root


def _peer() -> Any | None:
    _offline_nltk_words()
    try:
        import gem  # gem-llm, the reference implementation
    except Exception:
        return None
    return gem


def borrowed_sampler(env_id: str) -> Callable[[], str]:
    """Random actions from gem-core's env of the same id, for a peer env that has no sampler."""
    donor = gem_core.make(env_id)
    donor.reset(seed=0)

    def sample() -> str:
        action = donor.sample_random_action()
        _, _, terminated, truncated, _ = donor.step(action)
        if terminated or truncated:
            donor.reset()
        return action

    return sample


def has_sampler(env: Any) -> bool:
    try:
        env.sample_random_action()
    except NotImplementedError:
        return False
    return True


def stepper(env: Any, seed: int = 0, sampler: Callable[[], str] | None = None) -> Callable[[], float]:
    """One timed ``env.step`` per call (its seconds): the action is drawn, and a finished episode
    reset, outside the timer."""
    env.reset(seed=seed)
    sample = sampler or env.sample_random_action
    episode = 0

    def one() -> float:
        nonlocal episode
        action = sample()
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        spent = time.perf_counter() - t0
        if terminated or truncated:
            episode += 1
            env.reset(seed=seed + episode)
        return spent

    return one


def resetter(env: Any) -> Callable[[], float]:
    """One timed ``env.reset`` per call, a new seed (so a new puzzle) each time."""
    n = 0

    def one() -> float:
        nonlocal n
        t0 = time.perf_counter()
        env.reset(seed=n)
        n += 1
        return time.perf_counter() - t0

    return one


def interleaved(units: list[Callable[[], float]], seconds: float) -> list[float]:
    """Rates (calls/s) of timed units run in turn, one call each, until each has ``seconds`` of timed
    calls (at least one). Taking turns call by call puts every unit on the same machine: this
    machine's speed drifts by tens of percent over seconds, which back-to-back runs would compare."""
    spent, calls = [0.0] * len(units), [0] * len(units)
    deadline = time.perf_counter() + 3 * seconds * len(units) + 10  # a guard for very slow units
    while time.perf_counter() < deadline:
        due = [i for i in range(len(units)) if spent[i] < seconds or not calls[i]]
        if not due:
            break
        for i in due:
            spent[i] += units[i]()
            calls[i] += 1
    return [n / t if t else 0.0 for n, t in zip(calls, spent)]


def time_vector(step: Callable[[list[str]], Any], actions: Callable[[], list[str]], seconds: float) -> float:
    """Env-steps per second of a vector env's ``step`` (num_envs transitions per call)."""
    spent, calls, n = 0.0, 0, 0
    while spent < seconds:
        acts = actions()
        t0 = time.perf_counter()
        step(acts)
        spent += time.perf_counter() - t0
        calls += 1
        n += len(acts)
    return n / spent


def ours_vector(env_id: str, mode: str, seconds: float, **vector_kwargs: Any) -> float:
    with gem_core.make_vec(env_id, NUM_VECTOR_ENVS, vectorization_mode=mode, vector_kwargs=vector_kwargs) as vec:
        vec.reset(seed=0)
        return time_vector(vec.step, lambda: vec.call("sample_random_action"), seconds)


def peer_vector(gem: Any, env_id: str, async_mode: bool, seconds: float) -> float | None:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # gem-llm prints on make_vec
        vec = gem.make_vec([env_id] * NUM_VECTOR_ENVS, async_mode=async_mode)
    vec.reset(seed=0)
    if not has_sampler(vec.envs[0]):
        return None
    return time_vector(vec.step, lambda: [e.sample_random_action() for e in vec.envs], seconds)


def fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.1f}x"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="timed seconds per measurement")
    parser.add_argument("--games", default=",".join(GAME_NAMES), help="comma-separated game names")
    parser.add_argument("--vector-id", default="game:Minesweeper-v0-hard", help="light env for the vector rows")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args(argv)
    gem = _peer()
    peer_name = f"gem-llm {getattr(gem, '__version__', '')}".strip() if gem else "gem-llm (not installed)"
    print(f"gem-core {gem_core.__version__} vs {peer_name}; python {sys.version.split()[0]}, {os.cpu_count()} cpus\n")

    rows, borrowed, shared = [], [], []
    for name in args.games.split(","):
        for variant in VARIANTS:
            env_id = f"game:{name}-v0-{variant}"
            ours_env = gem_core.make(env_id)
            peer_env = sampler = None
            if gem is not None:
                try:
                    peer_env = gem.make(env_id)
                    peer_env.reset(seed=0)
                    if name in SHARED_ACTIONS:
                        sampler = borrowed_sampler(env_id)
                        shared.append(env_id)
                    elif not has_sampler(peer_env):
                        sampler = borrowed_sampler(env_id)
                        borrowed.append(env_id)
                except Exception as exc:  # the peer lacks or breaks on this id: record, don't stop
                    print(f"  peer failed on {env_id}: {exc!r}", file=sys.stderr)
                    peer_env = None
            peer_steps = peer_resets = None
            if peer_env is None:
                ours_steps, ours_resets = interleaved([stepper(ours_env), resetter(ours_env)], args.seconds)
            else:
                try:
                    ours_steps, peer_steps = interleaved([stepper(ours_env), stepper(peer_env, sampler=sampler)], args.seconds)
                    ours_resets, peer_resets = interleaved([resetter(ours_env), resetter(peer_env)], args.seconds)
                except Exception as exc:  # the peer broke mid-run: record, don't stop
                    print(f"  peer failed on {env_id}: {exc!r}", file=sys.stderr)
                    ours_steps, ours_resets = interleaved([stepper(ours_env), resetter(ours_env)], args.seconds)
                    peer_steps = peer_resets = None
            rows.append(
                [env_id, fmt(ours_steps), fmt(peer_steps), ratio(ours_steps, peer_steps), fmt(ours_resets), fmt(peer_resets), ratio(ours_resets, peer_resets)]
            )
            print(f"  {env_id}: done", file=sys.stderr)
    single = table(["env id", "steps/s", "peer steps/s", "speed-up", "resets/s", "peer resets/s", "speed-up"], rows)
    if borrowed:
        single += (
            "\n\nThe peer has no random-action sampler for " + ", ".join(borrowed) + "; its steps there use actions from gem-core's sampler for the same id."
        )
    if shared:
        games = sorted({env_id.split(":")[1].split("-")[0] for env_id in shared})
        single += "\n\nThe peer also steps on gem-core's sampler for " + "; ".join(f"{game} ({SHARED_ACTIONS[game]})" for game in games) + "."
    print(single, "\n")

    vrows = []
    for env_id in (args.vector_id, "bench:CpuBound-v0"):
        print(f"  vector {env_id}", file=sys.stderr)
        sync = ours_vector(env_id, "sync", args.seconds * 2)
        async2 = ours_vector(env_id, "async", args.seconds * 2, num_workers=2)
        peer_sync = peer_async = None
        if gem is not None and not env_id.startswith("bench:"):
            peer_sync = peer_vector(gem, env_id, False, args.seconds * 2)
            peer_async = peer_vector(gem, env_id, True, args.seconds * 2)
        vrows.append([env_id, fmt(sync), fmt(async2), ratio(async2, sync), fmt(peer_sync), fmt(peer_async)])
    vector = table([f"vector ({NUM_VECTOR_ENVS} envs)", "sync steps/s", "async (2 workers)", "async/sync", "peer sync", "peer async (threads)"], vrows)
    print(vector)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(f"{peer_name}\n\n{single}\n\n{vector}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
