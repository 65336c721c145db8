"""``gem-core eval``: the options and the two actions, ``run`` (the default) and ``report``.

``gem-core eval ENV_ID...`` is ``gem-core eval run ENV_ID...`` (:func:`with_default_action` puts the
``run`` in); ``gem-core eval report a.jsonl b.jsonl`` compares results files. argparse only at import:
the policies' heavy imports (torch, transformers) happen when a run starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from gem_core.cli_support import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, CliError, check_out_file, real_number, whole_number

ACTIONS = ("run", "report")
HELP = "evaluate a model (an OpenAI-compatible endpoint, a local HF model) or a baseline on env ids; compare runs"
DESCRIPTION = (
    "gem-core eval ENV_ID... (short for gem-core eval run ENV_ID...) plays fixed-seed episodes of each env with a "
    "policy and writes one JSON line per episode (--out); gem-core eval report FILE... compares results files."
)
RUN_DESCRIPTION = (
    "Play --episodes episodes of each env id (patterns such as 'game:*' or 'eval:*' expand over the registered ids; "
    "evaluation sets play each item once, in order) with seeds --seed-start, --seed-start+1, ..., so every model "
    "sees the same episodes. Up to --concurrency episodes are in flight; requests are retried with backoff on "
    "429/5xx, timeouts and garbled answers; a request that still fails ends only its episode, with the reason in "
    "the 'error' field. Results go to --out as they finish (one JSON line each); --resume continues a run that "
    "was stopped, playing only the episodes the file lacks (and those that ended with an error). Prints a "
    "summary table per env: success rate with a 95% Wilson interval, mean return, mean turns, tool calls."
)
DEFAULT_CONCURRENCY = 16


def with_default_action(argv: Sequence[str]) -> list[str]:
    """``["eval", ENV_ID, ...]`` -> ``["eval", "run", ENV_ID, ...]``; other command lines unchanged."""
    argv = list(argv)
    if len(argv) >= 2 and argv[0] == "eval" and argv[1] not in (*ACTIONS, "-h", "--help"):
        return [argv[0], "run", *argv[1:]]
    return argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gem_core.eval.policies import DTYPES, POLICIES

    actions = parser.add_subparsers(dest="eval_action", metavar="ACTION")
    actions.required = True
    run = actions.add_parser("run", help="play episodes with a policy (the default action)", description=RUN_DESCRIPTION)
    run.add_argument("env_ids", nargs="+", metavar="ENV_ID", help="env ids or patterns, e.g. game:GuessTheNumber-v0-easy 'game:*' 'eval:*'")
    run.add_argument("--episodes", type=whole_number(1), default=None, help="episodes per env (default 100; evaluation sets: all items)")
    run.add_argument("--seed-start", type=whole_number(0), default=0, help="seed of each env's first episode (default 0)")
    run.add_argument(
        "--balanced",
        action="store_true",
        help="GuessTheNumber with a fixed range: the first seeds from --seed-start whose targets are every number equally often "
        "(gem-core train's held-out set: --seed-start 1000000 --episodes 200); other envs: consecutive seeds as without it",
    )
    who = run.add_argument_group("policy")
    who.add_argument(
        "--policy",
        choices=POLICIES,
        default="openai",
        help="openai (an OpenAI-compatible endpoint, default), hf (a local model), vllm (a local model on vLLM's engine), random, oracle",
    )
    who.add_argument(
        "--model",
        default=None,
        help="openai: the served model's name (else $OPENAI_MODEL); hf, vllm: a local model directory, a hub id or smollm2-135m-instruct (the embedded real model)",
    )
    who.add_argument("--base-url", default=None, help="openai: the endpoint, e.g. http://127.0.0.1:8000/v1 (else $OPENAI_BASE_URL)")
    who.add_argument("--api-key", default=None, help="openai: the key (else $OPENAI_API_KEY; a local server needs none)")
    who.add_argument("--device", default="cpu", help="hf: torch device (default cpu)")
    who.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="hf, vllm: the weights' dtype (default auto: transformers keeps the checkpoint's, vLLM runs a float32 one in half precision; name one for both to play alike)",
    )
    sampling = run.add_argument_group("sampling and limits")
    sampling.add_argument("--max-tokens", type=whole_number(1), default=1024, help="tokens per response (default 1024)")
    sampling.add_argument("--temperature", type=real_number(0.0), default=0.0, help="sampling temperature (default 0: greedy)")
    sampling.add_argument("--top-p", type=real_number(0.0, low_open=True), default=1.0, help="nucleus sampling (default 1: off)")
    sampling.add_argument("--seed", type=whole_number(0), default=None, help="sampling seed (sent to the endpoint; seeds a local model)")
    sampling.add_argument("--max-turns", type=whole_number(1), default=None, help="turn limit on top of the env's own")
    sampling.add_argument(
        "--max-context-tokens",
        type=whole_number(2),
        default=None,
        help="hf, vllm: context limit (default: the model's window; vllm: also the engine's max_model_len)",
    )
    sampling.add_argument("--system-prompt", default=None, help="system message of every episode")
    sampling.add_argument(
        "--stop-after-box",
        action="store_true",
        help="hf, vllm: each response ends at the token that closes its \\boxed{...} move (as a run trained with rollout.stop_after_box played)",
    )
    task = run.add_argument_group("envs and tools (as in training: the same task rows)")
    task.add_argument("--tools", default="", help="comma-separated tools to wrap each env with: python, search")
    task.add_argument("--env-kwargs", default="{}", help="JSON object of make() kwargs, e.g. '{\"max_turns\": 6}'")
    running = run.add_argument_group("running")
    running.add_argument(
        "--concurrency", type=whole_number(1), default=DEFAULT_CONCURRENCY, help=f"episodes in flight (default {DEFAULT_CONCURRENCY}; hf: the batch size)"
    )
    running.add_argument(
        "--request-timeout", type=real_number(0.0, low_open=True), default=120.0, help="seconds to wait for an answer, per attempt (default 120)"
    )
    running.add_argument(
        "--retries", type=whole_number(0), default=5, help="retries of a request after 429/5xx/timeout/garbage, with exponential backoff (default 5)"
    )
    output = run.add_argument_group("results")
    output.add_argument("--out", default=None, help="results file: one JSON line per episode")
    output.add_argument("--resume", action="store_true", help="continue --out: play only the episodes it lacks or that ended with an error")
    output.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    output.add_argument("--save-transcripts", action="store_true", help="also write each episode's messages to --out")
    output.add_argument("--no-progress", action="store_true", help="no progress bar (it is also off when stderr is not a terminal)")

    report = actions.add_parser(
        "report",
        help="compare results files: a Markdown report and a bar chart",
        description="Compare results files of gem-core eval: a Markdown report (success rates with 95% Wilson intervals side by side, then each run's summary) and, with --plot, a bar chart PNG (needs matplotlib).",
    )
    report.add_argument("files", nargs="+", metavar="FILE", help="results files (JSONL) of gem-core eval")
    report.add_argument("--out", default=None, help="write the Markdown here (default: print it)")
    report.add_argument("--plot", default=None, metavar="PNG", help="also draw a bar chart of the success rates to this PNG file")


def main(args: argparse.Namespace, out: TextIO, err: TextIO | None = None) -> int:
    """Run ``gem-core eval``; a user's mistake becomes the CLI's one-line error."""

    err = sys.stderr if err is None else err
    for option in ("--out", "--plot"):  # a file in a directory that exists: nothing is created elsewhere
        path = getattr(args, option[2:], None)
        if path:
            check_out_file(path, option)
    try:
        if args.eval_action == "report":
            return report_main(args, out)
        return run_main(args, out, err)
    except OSError as exc:  # a file that cannot be read or written
        name = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        raise CliError(f"{exc.strerror or exc}{':' if name else ''}{name}") from None


# -- run -------------------------------------------------------------------------------------------------


def _close_policy(policy: Any) -> None:
    close = getattr(policy.shared, "close", None)
    if callable(close):
        close()


def run_main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gem_core.eval.plan import PlanError
    from gem_core.eval.policies import PolicyError
    from gem_core.eval.results import ResultsError, ResultsFile, check_resumable
    from gem_core.eval.runner import evaluate_sync
    from gem_core.eval.summary import format_table, summarize

    try:
        jobs, policy, config = _prepare(args)
        results = ResultsFile.open(args.out, resume=args.resume, overwrite=args.overwrite) if args.out else None
        if results is not None:
            try:
                check_resumable(results.done.values(), jobs, policy.label, results.path)
            except ResultsError:
                results.close()
                raise
    except (PlanError, PolicyError, ResultsError) as exc:
        raise CliError(str(exc)) from None
    done = dict(results.done) if results is not None else {}
    todo = [job for job in jobs if job.key not in done or done[job.key].error is not None]
    kept = [done[job.key] for job in jobs if job.key in done and done[job.key].error is None]
    progress = _Progress(len(jobs), kept, enabled=not args.no_progress and err.isatty(), file=err)

    def on_result(result: Any) -> None:
        if results is not None:
            results.append(result)
        done[result.key] = result
        progress.update(result)

    try:
        evaluate_sync(todo, policy, config, concurrency=args.concurrency, on_result=on_result, save_transcripts=args.save_transcripts)
    except KeyboardInterrupt:
        _close_policy(policy)
        progress.close()
        if results is not None:
            results.close()
            print(f"\ninterrupted: {len(done)} of {len(jobs)} episodes are in {results.path}; the same command with --resume plays the rest", file=err)
        return EXIT_INTERRUPTED
    progress.close()
    _close_policy(policy)
    final = results.finish(jobs) if results is not None else [done[job.key] for job in jobs]
    print(format_table(summarize(final)), file=out)
    errors = sum(r.error is not None for r in final)
    where = f" -> {results.path}" if results is not None else ""
    print(f"\n{len(final)} episodes ({len(todo)} played now) with {policy.label}{where}", file=out)
    if errors:
        print(f"{errors} episode(s) ended with an error (the 'error' field says why); --resume plays them again", file=out)
    return EXIT_ERROR if final and errors == len(final) else EXIT_OK


def _prepare(args: argparse.Namespace) -> tuple[list[Any], Any, Any]:
    """The jobs, the policy and the run config from the options (the usage errors raise here)."""
    from gem_core.eval.plan import expand_env_ids, plan
    from gem_core.eval.policies import BASELINE_METHODS, baseline_policy, context_window, hf_policy, openai_policy, vllm_policy
    from gem_core.rollout import RunConfig, SamplingParams
    from gem_core.rollout.policy import closing_brace_ids, merge_stop_ids
    from gem_core.tasks import parse_env_kwargs
    from gem_core.tools.factory import parse_tools

    if not args.out:
        for flag, given in (("--resume", args.resume), ("--overwrite", args.overwrite), ("--save-transcripts", args.save_transcripts)):
            if given:
                raise CliError(f"{flag} needs --out FILE")
    if args.resume and args.overwrite:
        raise CliError("--resume and --overwrite contradict each other: pick one")
    if args.policy in BASELINE_METHODS and (args.model or args.base_url):
        raise CliError(f"--policy {args.policy} plays without a model: drop --model/--base-url")
    if args.stop_after_box and args.policy not in ("hf", "vllm"):
        raise CliError(f"--stop-after-box stops at the model's own tokens: it needs --policy hf or vllm, not {args.policy}")
    try:
        env_kwargs = parse_env_kwargs(args.env_kwargs)
        tools = parse_tools(args.tools)
    except ValueError as exc:
        raise CliError(f"--env-kwargs/--tools: {exc}") from None
    env_ids = expand_env_ids(args.env_ids)
    try:  # a bad make() kwarg, a tool without its backend: the user's to fix
        jobs = plan(
            env_ids,
            args.episodes,
            seed_start=args.seed_start,
            env_kwargs=env_kwargs,
            tools=tools,
            need=BASELINE_METHODS.get(args.policy),
            balanced=args.balanced,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.policy in BASELINE_METHODS:
        policy = baseline_policy(args.policy)
    elif args.policy == "hf":
        policy = hf_policy(args.model, device=args.device, batch_size=args.concurrency, seed=args.seed or 0, system_prompt=args.system_prompt, dtype=args.dtype)
    elif args.policy == "vllm":
        policy = vllm_policy(
            args.model,
            batch_size=args.concurrency,
            seed=args.seed or 0,
            system_prompt=args.system_prompt,
            max_model_len=args.max_context_tokens,
            dtype=args.dtype,
        )
    else:
        policy = openai_policy(
            args.base_url,
            args.model,
            args.api_key,
            timeout=args.request_timeout,
            retries=args.retries,
            concurrency=args.concurrency,
            system_prompt=args.system_prompt,
        )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if args.stop_after_box:  # the template's end of turn first, then every token that can close the move
        params = merge_stop_ids(policy.formatter.sampling_params(params), closing_brace_ids(policy.formatter.tokenizer))
    config = RunConfig(params=params, max_turns=args.max_turns, max_context_tokens=args.max_context_tokens or context_window(policy))
    return jobs, policy, config


class _Progress:
    """A tqdm bar over the planned episodes with the running success rate (resumed episodes included)."""

    def __init__(self, total: int, already: Sequence[Any], *, enabled: bool, file: TextIO):
        self.finished = len(already)
        self.successes = sum(bool(r.success) for r in already)
        self.errors = sum(r.error is not None for r in already)
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # a dependency, but a trimmed install may lack it
                return
            self.bar = tqdm(total=total, initial=self.finished, unit="ep", desc="eval", file=file, dynamic_ncols=True)
            self._show()

    def update(self, result: Any) -> None:
        self.finished += 1
        self.successes += bool(result.success)
        self.errors += result.error is not None
        if self.bar is not None:
            self.bar.update(1)
            self._show()

    def postfix(self) -> str:
        rate = self.successes / self.finished if self.finished else 0.0
        return f"success {rate:.3f} ({self.successes}/{self.finished})" + (f", {self.errors} errors" if self.errors else "")

    def _show(self) -> None:
        assert self.bar is not None
        self.bar.set_postfix_str(self.postfix(), refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# -- report ----------------------------------------------------------------------------------------------


def report_main(args: argparse.Namespace, out: TextIO) -> int:
    from gem_core.eval.report import ReportError, load_runs, markdown, plot, require_matplotlib
    from gem_core.eval.results import ResultsError

    try:
        if args.plot:
            require_matplotlib()  # before any work: one line if it is missing
        runs = load_runs(args.files)
    except (ReportError, ResultsError) as exc:
        raise CliError(str(exc)) from None
    chart = None
    if args.plot:
        plot(runs, args.plot)
        base = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        chart = os.path.relpath(os.path.abspath(args.plot), base)
    text = markdown(runs, chart)
    if args.out:
        directory = os.path.dirname(args.out)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"report: {args.out}" + (f", chart: {args.plot}" if args.plot else ""), file=out)
    else:
        out.write(text)
    return EXIT_OK
