"""``gem-core eval``: evaluate any model (an OpenAI-compatible endpoint, a local HF model) or a baseline
on env ids, with fixed seeds, many episodes in flight, resumable JSONL results and a comparison report.

    jobs = plan(expand_env_ids(["game:*"]), 50)              # fixed seeds: every model sees these episodes
    evaluate_sync(jobs, baseline_policy("oracle"), RunConfig(), concurrency=16, on_result=print)
    print(format_table(summarize(read_results("run.jsonl")[0])))

The modules: :mod:`~gem_core.eval.plan` (which episodes), :mod:`~gem_core.eval.policies` (what plays
them), :mod:`~gem_core.eval.runner` (playing), :mod:`~gem_core.eval.results` (the JSONL file),
:mod:`~gem_core.eval.summary` (rates and intervals), :mod:`~gem_core.eval.report` (Markdown and chart),
:mod:`~gem_core.eval.cli` (the command).
"""

from gem_core.eval.plan import EvalJob, PlanError, expand_env_ids, plan
from gem_core.eval.policies import EvalPolicy, baseline_policy, hf_policy, openai_policy, vllm_policy
from gem_core.eval.results import EpisodeResult, ResultsError, ResultsFile, read_results
from gem_core.eval.runner import evaluate, evaluate_sync
from gem_core.eval.summary import EnvSummary, format_table, summarize, wilson_interval

__all__ = [
    "EnvSummary",
    "EpisodeResult",
    "EvalJob",
    "EvalPolicy",
    "PlanError",
    "ResultsError",
    "ResultsFile",
    "baseline_policy",
    "evaluate",
    "evaluate_sync",
    "expand_env_ids",
    "format_table",
    "hf_policy",
    "openai_policy",
    "plan",
    "read_results",
    "summarize",
    "vllm_policy",
    "wilson_interval",
]
