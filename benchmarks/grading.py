"""Math grading: gem-core's grader against gem-llm's, verdicts and grades per second, in one run.

Two workloads, both graded by both graders:

* the answer table of tests/grading/math_cases.py (equivalent and non-equivalent answers, LaTeX forms,
  format errors): every verdict that differs between the two is listed with the expected one, so each
  disagreement is either a documented fix or a bug;
* two throughput sets, graded with an empty verdict cache: generated problems (gem_core.envs.math_data)
  with one response per problem in another form than the gold (a/b for a fraction, a reordered set,
  17.0 for 17) and one wrong -- gem-core's cheap rules decide most of these -- and expressions that only
  math-verify decides (k sqrt 2 as sqrt(2k^2), factored polynomials, multiples of pi), right and wrong.

gem-core grades through gem_core.grading.grade_math (cheap rules, then math-verify in the shared worker
pool, each answer with its own time limit), one caller and then ``--threads`` callers at once (many envs
of a rollout). gem-llm grades with ``boxed_reward_fn(fast=False)``, what its MathEnv calls, in this process
with one caller: it cannot take more in one process (its SIGALRM time limits raise ValueError off the
main thread; the run shows it), so its in-process throughput is its one-caller rate; across processes
it starts a Pool(1) per env, which the rollout-step comparison measures. Run::

    python benchmarks/grading.py            # gem-llm installed beside gem-core: `nox -s bench_grading`
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "grading"))

from math_cases import MATH_CASES  # noqa: E402

from gem_core.envs.math_data import generate_math_rows  # noqa: E402


def throughput_pairs(n: int, seed: int = 1) -> list[tuple[str, str, bool]]:
    """(gold, response, expected) pairs: per generated problem one right answer in another form, one wrong."""
    pairs = []
    for i, row in enumerate(generate_math_rows(n, seed)):
        gold, kind = row["answer"], row["kind"]
        if kind == "quadratic":
            roots = gold.strip("\\{}").split(", ")
            right = "\\{" + ", ".join(reversed(roots)) + "\\}"
            wrong = "\\{" + roots[0] + ", " + str(int(roots[1]) + 1) + "\\}"
        elif kind == "fractions":
            value = _fraction(gold)
            right = f"{value.numerator}/{value.denominator}" if value.denominator != 1 else f"{value.numerator}.0"
            wrong = f"\\frac{{{value.numerator + 1}}}{{{value.denominator}}}"
        else:
            right = f"{int(gold)}.0" if i % 2 else f"\\left( {gold} \\right)"
            wrong = str(int(gold) + 1 + i % 3)
        pairs.append((gold, f"Working... so the answer is \\boxed{{{right}}}.", True))
        pairs.append((gold, f"I think it is \\boxed{{{wrong}}}.", False))
    return pairs


def expression_pairs(n: int) -> list[tuple[str, str, bool]]:
    """(gold, response, expected) pairs that only math-verify decides: roots, polynomials, multiples of pi."""
    pairs = []
    for k in range(2, n + 2):
        for gold, right, wrong in (
            (f"{k}\\sqrt{{2}}", f"\\sqrt{{{2 * k * k}}}", f"\\sqrt{{{2 * k * k + 1}}}"),
            (f"x^2+{2 * k}x+{k * k}", f"(x+{k})^2", f"(x+{k + 1})^2"),
            (f"{k}\\pi", f"\\pi \\cdot {k}", f"{k + 1}\\pi"),
        ):
            pairs.append((gold, f"So \\boxed{{{right}}}.", True))
            pairs.append((gold, f"So \\boxed{{{wrong}}}.", False))
    return pairs[: 2 * n]


def _fraction(latex: str) -> Fraction:
    sign = -1 if latex.startswith("-") else 1
    body = latex.lstrip("-")
    if body.startswith("\\frac"):
        num, den = body[len("\\frac{") : -1].split("}{")
        return sign * Fraction(int(num), int(den))
    return sign * Fraction(int(body))


def gem_core_grader() -> Any:
    from gem_core.grading.math import grade_math

    return lambda response, gold: grade_math(response, gold).correct


def gem_llm_grader() -> Any | None:
    try:
        from gem.utils.math_grader import boxed_reward_fn
    except Exception as exc:  # not installed here
        print(f"gem-llm is not importable here ({type(exc).__name__}: {exc}); install it: pip install gem-llm==0.1.0")
        return None
    return lambda response, gold: boxed_reward_fn(response, gold, fast=False)[1] == 1


def timed(grade: Any, pairs: list[tuple[str, str, bool]], threads: int = 1) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    if threads == 1:
        verdicts = [grade(response, gold) for gold, response, _ in pairs]
    else:
        with ThreadPoolExecutor(threads) as executor:
            verdicts = list(executor.map(lambda p: grade(p[1], p[0]), pairs))
    return time.perf_counter() - start, verdicts


def peer_with_threads(peer: Any, pairs: list[tuple[str, str, bool]], threads: int) -> str:
    """What gem-llm's grader does when ``threads`` callers share it (a rollout's envs grading at once)."""
    try:
        seconds, _ = timed(peer, pairs, threads)
    except ValueError as exc:  # signal.signal/alarm off the main thread
        return f"fails ({exc})"
    return f"{len(pairs) / seconds:.0f} grades/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=200, help="problems in each throughput set (2 answers each)")
    parser.add_argument("--envs", type=int, default=64, help="envs in the rollout-step comparison")
    parser.add_argument("--threads", type=int, default=max(2, os.cpu_count() or 2), help="gem-core callers at once")
    args = parser.parse_args(argv)

    ours, peer = gem_core_grader(), gem_llm_grader()
    ours("\\boxed{\\frac{1}{3}}", "0.3333333")  # start the pool's worker (imports math-verify) outside the timing

    print("## Verdicts on the answer table\n")
    table = [(gold, response, expected) for gold, response, expected, _why in MATH_CASES]
    _t, our_verdicts = timed(ours, table)
    peer_verdicts = timed(peer, table)[1] if peer else [None] * len(table)
    our_right = sum(v == e for v, (_g, _r, e) in zip(our_verdicts, table))
    print(f"{len(table)} cases: gem-core as expected on {our_right}", end="")
    if peer:
        peer_right = sum(v == e for v, (_g, _r, e) in zip(peer_verdicts, table))
        print(f", gem-llm on {peer_right}")
        print("\n| case | gold | response | expected | gem-core | gem-llm | which is right |\n|---|---|---|---|---|---|---|")
        for (gold, response, expected, why), mine, theirs in zip(MATH_CASES, our_verdicts, peer_verdicts):
            if mine != theirs:
                right = "gem-core" if mine == expected else ("gem-llm" if theirs == expected else "neither")
                print(f"| {why} | `{gold}` | `{response[:40]}` | {expected} | {mine} | {theirs} | {right} |")
    else:
        print()

    from gem_core.grading import math as math_grading

    for title, pairs in (
        ("numbers (generated problems: most decided by the cheap rules)", throughput_pairs(args.problems)),
        ("expressions (roots, polynomials, pi: every one through math-verify)", expression_pairs(args.problems)),
    ):
        print(f"\n## Throughput, {title}: {len(pairs)} distinct (gold, response) pairs\n")
        print("| grader | callers | seconds | grades/s | as expected |\n|---|---|---|---|---|")
        math_grading._cache.data.clear()
        rows = [("gem-core", 1, *timed(ours, pairs))]
        math_grading._cache.data.clear()  # the threaded run starts with no cached verdict either
        rows.append(("gem-core", args.threads, *timed(ours, pairs, args.threads)))
        if peer:
            rows.append(("gem-llm boxed_reward_fn", 1, *timed(peer, pairs)))
        for name, callers, seconds, verdicts in rows:
            right = sum(v == e for v, (_g, _r, e) in zip(verdicts, pairs))
            print(f"| {name} | {callers} | {seconds:.2f} | {len(pairs) / seconds:.0f} | {right}/{len(pairs)} |")
        if peer:
            disagree = [(g, r, e, a, b) for (g, r, e), a, b in zip(pairs, rows[0][3], rows[2][3]) if a != b]
            print(f"\nverdicts that differ: {len(disagree)}")
            for gold, response, expected, mine, theirs in disagree[:20]:
                print(f"  gold {gold!r}, {response!r}: expected {expected}, gem-core {mine}, gem-llm {theirs}")
            print(f"gem-llm, {args.threads} callers (threads): {peer_with_threads(peer, pairs, args.threads)}")
            print(
                f"speed-up over gem-llm: one caller each {rows[2][2] / rows[0][2]:.1f}x; gem-core's {args.threads} callers against gem-llm's one {rows[2][2] / rows[1][2]:.1f}x"
            )
    rollout(args.envs, peer is not None)
    return 0


def rollout(n: int, with_peer: bool) -> None:
    """``n`` math envs made, reset and stepped once each, as one rollout step of a training batch: gem-core's
    envs share the process's grading pool; gem-llm's MathEnv starts a multiprocessing.Pool(1) per env."""
    import json
    import tempfile

    import gem_core

    pairs = expression_pairs(n)[::2][:n]  # right answers: each goes through math-verify
    rows = [{"problem": f"question {i}", "answer": gold} for i, (gold, _r, _e) in enumerate(pairs)]
    responses = {row["problem"]: response for row, (_g, response, _e) in zip(rows, pairs)}
    print(f"\n## One rollout step: {n} envs made, reset and stepped (expression answers)\n")
    print("| implementation | make s | reset+step s | rewards 1 |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/rows.jsonl"
        with open(path, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
        from gem_core.grading import math as math_grading

        math_grading._cache.data.clear()
        start = time.perf_counter()
        envs = [gem_core.make("math:Math12K", data_files=path, shuffle=False) for _ in range(n)]
        made = time.perf_counter() - start
        start = time.perf_counter()
        rewards = []
        for i, env in enumerate(envs):
            question, _ = env.reset(options={"idx": i})
            rewards.append(env.step(responses[question.split("\n")[0]])[1])
        stepped = time.perf_counter() - start
        print(f"| gem-core (one shared pool) | {made:.2f} | {stepped:.2f} | {sum(rewards):.0f}/{n} |")
        for env in envs:
            env.close()
        if not with_peer:
            return
        import logging

        from datasets import Dataset
        from gem.envs.math_env import MathEnv

        logging.getLogger().setLevel(logging.WARNING)  # gem-llm logs every reset(idx=...)

        table = Dataset.from_list(rows)
        start = time.perf_counter()
        peers = [MathEnv(dataset=table, eval=True) for _ in range(n)]
        made = time.perf_counter() - start
        start = time.perf_counter()
        rewards = []
        for i, env in enumerate(peers):
            question, _ = env.reset(idx=i)
            rewards.append(env.step(responses[question])[1])
        stepped = time.perf_counter() - start
        print(f"| gem-llm MathEnv (a Pool(1) per env) | {made:.2f} | {stepped:.2f} | {sum(rewards):.0f}/{n} |")
        for env in peers:
            env.close()


if __name__ == "__main__":
    raise SystemExit(main())
