"""The launcher's argument handling (OpenRLHF's own parser), the gem-core commands and the dataset."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import faithful_engine, openrlhf_params, workers_answer

from gem_core import cli
from gem_integrations.openrlhf import agent_path, train_ppo_ray

BASE = ["--actor.model_name_or_path", "some/model", "--train.agent_func_path", agent_path()]


def test_launcher_adds_rebn_to_openrlhfs_own_parser():
    args = train_ppo_ray.parse_args([*BASE, "--algo.advantage.estimator", "rebn", "--algo.advantage.gamma", "0.9"])
    assert args.algo.advantage.estimator == "rebn"
    assert args.algo.advantage.gamma == 0.9
    assert (args.algo.advantage.rebn_eps, args.algo.advantage.rebn_ddof) == (1e-6, 0)
    args = train_ppo_ray.parse_args([*BASE, "--algo.advantage.estimator", "rebn", "--algo.advantage.rebn_ddof", "1"])
    assert args.algo.advantage.rebn_ddof == 1


def test_launcher_keeps_the_other_choices_and_rejects_unknown_ones(capsys):
    assert train_ppo_ray.parse_args([*BASE, "--algo.advantage.estimator", "group_norm"]).algo.advantage.estimator == "group_norm"
    with pytest.raises(SystemExit):
        train_ppo_ray.parse_args([*BASE, "--algo.advantage.estimator", "rebn2"])
    assert "invalid choice" in capsys.readouterr().err


def test_openrlhf_alone_rejects_rebn(monkeypatch, capsys):
    import argparse

    import openrlhf.utils.config as config

    # OpenRLHF's module without the launcher's parser patch: argparse refuses rebn before hierarchize.
    monkeypatch.setattr(train_ppo_ray, "rebn_choice", lambda: __import__("contextlib").nullcontext())
    with pytest.raises(SystemExit):
        train_ppo_ray.parse_args([*BASE, "--algo.advantage.estimator", "rebn"])
    assert "invalid choice: 'rebn'" in capsys.readouterr().err
    assert argparse._ActionsContainer.add_argument.__module__ == "argparse" and config.hierarchize.__name__ == "hierarchize"


def test_runtime_env_installs_the_hook_and_the_turn_rewards():
    env = train_ppo_ray.runtime_env()
    assert env["worker_process_setup_hook"] == "gem_integrations.openrlhf.plugin_spec.setup_worker"
    assert env["env_vars"]["GEM_OPENRLHF_TURNS"] == "1"


def test_check_fails_loudly_when_workers_lack_the_patch(monkeypatch):
    workers_answer(monkeypatch, False)  # a worker answering "not active"
    with pytest.raises(train_ppo_ray.PatchNotActive, match="rebn"):
        train_ppo_ray.check_patch_active()


def test_gem_core_openrlhf_agent_path(capsys):
    assert cli.main(["openrlhf", "agent-path"]) == 0
    assert capsys.readouterr().out.strip() == agent_path()


def test_gem_core_openrlhf_train_passes_everything_to_the_launcher(monkeypatch):
    seen = {}
    monkeypatch.setattr(train_ppo_ray, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main(["openrlhf", "train", "--algo.advantage.estimator", "rebn", "--help"]) == 0
    assert seen["argv"] == ["--algo.advantage.estimator", "rebn", "--help"]


def test_make_dataset_rows_drive_the_agent(tmp_path, executor, tokenizer, capsys):
    out = tmp_path / "prompts.jsonl"
    assert cli.main(["make-dataset", "openrlhf", "--env", "game:Mastermind-v0-easy", "--n", "3", "--seed-start", "5", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [json.loads(r["label"])["seed"] for r in rows] == [5, 6, 7]
    engine = faithful_engine(tokenizer)
    result = asyncio.run(executor.execute(rows[0]["prompt"], rows[0]["label"], openrlhf_params(max_tokens=40), 2000, tokenizer, engine))
    first_prompt = tokenizer.decode(engine.requests[0][0], skip_special_tokens=False)
    assert rows[0]["prompt"] in first_prompt  # the env's own first observation, in the chat template
    assert result["extra_logs"]["gem_success"] == 1.0


def test_make_dataset_rejects_bad_input(tmp_path, capsys):
    assert cli.main(["make-dataset", "openrlhf", "--env", "game:NoSuchGame-v0", "--n", "1", "--out", str(tmp_path / "x")]) == 2
    assert cli.main(["make-dataset", "openrlhf", "--env", "game:Mastermind-v0", "--n", "1", "--env-kwargs", "[1]", "--out", str(tmp_path / "x")]) == 2


def test_the_gem_core_openrlhf_commands_import_no_trainer():
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from gem_core import cli\n"
        "assert cli.main(['openrlhf', 'agent-path']) == 0\n"
        "cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'openrlhf', 'ray', 'transformers', 'deepspeed', 'vllm') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_make_dataset_writes_the_limits_into_the_label(tmp_path):
    from gem_core.tasks import TaskSpec

    out = tmp_path / "p.jsonl"
    argv = [
        "make-dataset",
        "openrlhf",
        "--env",
        "game:GuessTheNumber-v0-easy",
        "--n",
        "2",
        "--out",
        str(out),
        "--max-turns",
        "3",
        "--max-turn-tokens",
        "64",
        "--max-context-tokens",
        "900",
        "--system-prompt",
        "Play well.",
    ]
    assert cli.main(argv) == 0
    spec = TaskSpec.from_json(json.loads(out.read_text().splitlines()[1])["label"])
    assert (spec.seed, spec.max_turns, spec.max_turn_tokens, spec.max_context_tokens, spec.system_prompt) == (1, 3, 64, 900, "Play well.")
