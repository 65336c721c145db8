"""A script of the repository (a benchmark under benchmarks/, not a package) loaded as a module in a test, and
what the tests of benchmarks/cross_framework.py's arms check of its records."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def script_module(path: str | Path) -> Iterator[ModuleType]:
    """The script at ``path`` as a module named after its file, registered in ``sys.modules`` while the
    block runs (its dataclasses and pickled functions look their module up by name), removed after it."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def check_arm_evaluations(out: Path, trainer: str, seed: int = 0, episodes: int | None = None) -> dict:
    """For a test of one of benchmarks/cross_framework.py's arms, after the benchmark ran into ``out``: the run
    ``<trainer>-seed<seed>`` is recorded as ended well, each model it kept is a Hugging Face model folder with its
    tokenizer, each was evaluated by gem-core eval on the starting weights' seeds (``episodes`` of them, none
    errored), and the table has its row; returns the run's record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = out / f"{trainer}-seed{seed}"
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == 0 and record["seconds_per_update"] > 0 and record["peak_rss_gb"] > 0.5, record
    start = sorted(json.loads(line)["seed"] for line in open(out / "start" / "eval.jsonl"))
    assert episodes is None or len(start) == episodes
    for update, checkpoint in record["checkpoints"].items():
        AutoModelForCausalLM.from_pretrained(checkpoint)
        AutoTokenizer.from_pretrained(checkpoint)
        summary = json.loads((run / "eval" / f"update-{update}.json").read_text())
        assert summary["model"] == checkpoint and summary["episodes"] == len(start) and summary["errors"] == 0, summary
        assert sorted(json.loads(line)["seed"] for line in open(run / "eval" / f"update-{update}.jsonl")) == start
    assert f"| {trainer} {record['version']} | {seed} |" in (out / "cross_framework.md").read_text()
    return record
