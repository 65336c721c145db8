"""``gem-core play``: one episode of an env in the terminal (you play, or the random or oracle policy), or a
policy over a vector env in batch, with its throughput (:class:`BatchSummary`). The command's parser is
:func:`gem_core.cli.build_parser`'s; this module runs it."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import gem_core
from gem_core.cli_support import EXIT_OK, CliError
from gem_core.errors import GemError
from gem_core.parsing import boxed, last_boxed
from gem_core.wrappers import EpisodeStatistics, EpisodeTotals


# -- play: one episode -----------------------------------------------------------------------------


def cmd_play(args: argparse.Namespace, out: TextIO) -> int:
    """``gem-core play``: one episode (human, random or oracle) or a batch over a vector env."""
    env_id = gem_core.spec(args.env_id).id  # raises UnknownEnvError before anything is built
    batch = args.num_envs is not None or args.episodes is not None
    if batch:
        policy = args.policy or "random"
        if policy == "human":
            raise CliError("batch mode (--num-envs/--episodes) needs --policy random or --policy oracle")
        if policy == "oracle":
            _require_oracle(env_id)
        num_envs = args.num_envs or 1
        episodes = args.episodes or num_envs
        seed = 0 if args.seed is None else args.seed
        show_progress = not args.no_progress and out.isatty()
        summary = run_batch(env_id, policy, num_envs, episodes, seed, args.vector, show_progress)
        print(summary.table(), file=out)
        return EXIT_OK
    policy = args.policy or "human"
    env = gem_core.make(env_id)
    try:
        if policy == "human":
            return play_human(env, args.seed, sys.stdin, out)
        if policy == "oracle" and not hasattr(env, "oracle_action"):
            raise CliError(f"{env_id} has no oracle_action(); use --policy random or human")
        return play_self(env, policy, args.seed, out)
    finally:
        env.close()


def play_human(env: gem_core.Env, seed: int | None, stdin: TextIO, out: TextIO) -> int:
    """A person plays one episode: actions are read line by line; EOF (Ctrl-D) quits cleanly."""
    obs, info = env.reset(seed=seed)
    print(_rule(f"{env.spec.id if env.spec else env}  (seed {seed})"), file=out)
    print(gem_core.model_message(obs, info), file=out)
    print("(type your move; a bare answer is put in \\boxed{} for you; Ctrl-D quits)", file=out)
    turn = 0
    total = 0.0
    while True:
        print("> ", end="", file=out, flush=True)
        line = stdin.readline()
        if not line:  # EOF
            print("\nbye (episode not finished)", file=out)
            return EXIT_OK
        text = line.strip()
        if not text:
            continue
        action = text if last_boxed(text) is not None else boxed(text)
        turn += 1
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        shown = obs if terminated or truncated else gem_core.model_message(obs, info)  # what a model would see
        print(_turn_text(turn, action, shown, float(reward), show_action=action != text), file=out)
        if terminated or truncated:
            print(_episode_end(turn, total, info, terminated), file=out)
            return EXIT_OK


def play_self(env: gem_core.Env, policy: str, seed: int | None, out: TextIO) -> int:
    """A random or oracle policy plays one episode; every turn is printed."""
    obs, info = env.reset(seed=seed)
    print(_rule(f"{env.spec.id if env.spec else env}  (seed {seed}, policy {policy})"), file=out)
    print(gem_core.model_message(obs, info), file=out)
    act = env.sample_random_action if policy == "random" else env.oracle_action
    turn = 0
    total = 0.0
    while True:
        action = act()
        turn += 1
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        shown = obs if terminated or truncated else gem_core.model_message(obs, info)
        print(_turn_text(turn, action, shown, float(reward), show_action=True), file=out)
        if terminated or truncated:
            print(_episode_end(turn, total, info, terminated), file=out)
            return EXIT_OK


def _rule(title: str) -> str:
    return f"== {title} =="


def _turn_text(turn: int, action: str, obs: str, reward: float, show_action: bool) -> str:
    head = f"[turn {turn}] " + (f"action {action}  " if show_action else "") + f"reward {reward:+.3f}"
    return f"{head}\n{obs}"


def _episode_end(turns: int, total: float, info: dict[str, Any], terminated: bool) -> str:
    how = "won" if info.get("success") else ("ended" if terminated else "truncated (turn limit)")
    return f"== episode {how} after {turns} turn{'s' if turns != 1 else ''}, return {total:+.3f} =="


def _require_oracle(env_id: str) -> None:
    probe = gem_core.make(env_id)
    try:
        if not hasattr(probe, "oracle_action"):
            raise CliError(f"{env_id} has no oracle_action(); use --policy random")
    finally:
        probe.close()


# -- play: a batch over a vector env ---------------------------------------------------------------


@dataclass
class BatchSummary:
    """Totals of a batch run; ``table()`` renders the printed summary."""

    env_id: str
    policy: str
    num_envs: int
    vector: str
    seed: int
    episodes: int
    mean_return: float
    success_rate: float
    mean_length: float
    format_error_rate: float
    truncation_rate: float
    steps: int
    seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")

    def table(self) -> str:
        rows = [
            ("episodes", f"{self.episodes}"),
            ("mean return", f"{self.mean_return:.4f}"),
            ("success rate", f"{self.success_rate:.1%}"),
            ("mean length", f"{self.mean_length:.2f} turns"),
            ("format-error rate", f"{self.format_error_rate:.1%} of episodes"),
            ("truncation rate", f"{self.truncation_rate:.1%} of episodes"),
            ("steps/s", f"{self.steps_per_second:,.0f}  ({self.steps} turns in {self.seconds:.2f}s)"),
        ]
        width = max(len(name) for name, _ in rows)
        title = f"{self.env_id}  policy={self.policy}  num_envs={self.num_envs}  vector={self.vector}  seed={self.seed}"
        return "\n".join([title] + [f"  {name:<{width}}  {value}" for name, value in rows])


def run_batch(env_id: str, policy: str, num_envs: int, episodes: int, seed: int, vector: str, show_progress: bool) -> BatchSummary:
    """Step ``num_envs`` envs with ``policy`` until ``episodes`` episodes have finished.

    The vector env autoresets on the step after an episode ends (NEXT_STEP): that step is a reset,
    not a turn, so it is neither counted as a step nor added to the next episode. Episodes are
    counted in the order they finish (env order within a step) until ``episodes`` are done. The
    clock for steps/s starts after the first reset; later (auto)resets are inside it.
    """
    import numpy as np

    method = "sample_random_action" if policy == "random" else "oracle_action"
    vec = gem_core.make_vec(env_id, num_envs, vectorization_mode=vector, wrappers=(EpisodeStatistics,))
    progress = _progress_bar(episodes, env_id, show_progress)
    finished: list[dict] = []  # each ended episode's info["episode"], in the order they end
    resets_next = np.zeros(num_envs, dtype=bool)  # envs that ended last step: this step resets them
    steps = 0
    try:
        vec.reset(seed=seed)
        started = time.perf_counter()  # after the first reset, which may load lazy data (word lists)
        while len(finished) < episodes:
            actions = _policy_actions(vec, method, resets_next)
            _, _, terminated, truncated, infos = vec.step(actions)
            ended = np.logical_or(terminated, truncated)
            autoreset = np.fromiter((bool(info.get("autoreset", False)) for info in infos), bool, num_envs)
            turn = ~(resets_next | autoreset)  # an autoreset step is a reset, not a turn
            steps += int(turn.sum())
            for i in np.flatnonzero(turn & ended):
                if len(finished) < episodes:
                    finished.append(infos[i]["episode"])
                    if progress is not None:
                        progress.update(1)
            resets_next = ended
        seconds = time.perf_counter() - started
    finally:
        if progress is not None:
            progress.close()
        vec.close()
    totals = EpisodeTotals.of(finished)
    return BatchSummary(
        env_id=env_id,
        policy=policy,
        num_envs=num_envs,
        vector=vector,
        seed=seed,
        episodes=totals.episodes,
        mean_return=totals.mean_return,
        success_rate=totals.success_rate,
        mean_length=totals.mean_length,
        format_error_rate=totals.format_error_rate,
        truncation_rate=totals.truncation_rate,
        steps=steps,
        seconds=seconds,
    )


def _policy_actions(vec: Any, method: str, ended: Any) -> list[Any]:
    """One action per env from ``vec.call(method)``.

    Envs whose episode just ended are also asked (``call`` reaches every env), though their action
    is ignored by the autoreset. A game may be unable to pick a move in a finished state; if the
    call fails, the ended envs are reset first (a subset step, which is their NEXT_STEP autoreset)
    and the call is repeated on live envs only.
    """
    try:
        return list(vec.call(method))
    except GemError:
        if not ended.any():
            raise
    vec.step({int(i): "" for i in ended.nonzero()[0]})  # the autoreset step of the ended envs
    ended[:] = False  # they are live now: their next step is a real turn
    return list(vec.call(method))


def _progress_bar(total: int, label: str, enabled: bool) -> Any:
    """A tqdm bar counting finished episodes, or ``None`` (disabled, or tqdm not installed)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a trimmed install may lack it
        return None
    return tqdm(total=total, desc=label, unit="ep")
