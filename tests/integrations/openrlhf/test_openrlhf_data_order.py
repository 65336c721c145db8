"""The prompt rows in order (gem_integrations.openrlhf.data_order): OpenRLHF 0.11.2's own ``prepare_datasets``, with
its own ``DeepspeedStrategy`` (``get_strategy`` of the launcher's parsed arguments) and ``blending_datasets``, over
the files an experiment's ``make-dataset`` commands write, called through the patch. With the experiment's
``--data.shuffle false`` the loader yields the reference run's start states in order (the same as every plugin's);
without it, OpenRLHF's shuffled order. The eval loader is OpenRLHF's; a bad value is one line."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch
from conftest import workers_answer

from gem_core.cli import main as gem_core_main
from gem_core.cli_support import CliError
from gem_core.experiment import parse_experiment, run_start_seeds, train_rows
from gem_core.experiment_scripts import dataset_command
from gem_core.tasks import TaskSpec
from gem_integrations.openrlhf import agent_path, plugin_spec, train_ppo_ray
from gem_integrations.openrlhf.experiment import PRECISION, arguments

#: 6 updates of 8 episodes in groups of 2: 24 training rows, each update's 4 start states drawn from seed 11; 10
#: held-out rows.
EXPERIMENT = parse_experiment("[rollout]\nepisodes_per_update = 8\ngroup_size = 2\n[training]\nupdates = 6\n[seeds]\nseed = 11\neval_episodes = 10\n")
#: What the reference run plays, update after update (gem_core.experiment.update_start_seeds).
REFERENCE = run_start_seeds(EXPERIMENT.seed, train_rows(EXPERIMENT), EXPERIMENT.groups_per_update)
BASE = ["--actor.model_name_or_path", "some/model", "--train.agent_func_path", agent_path()]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The experiment's two prompt files, written by its own ``make-dataset`` commands (as its script runs them)."""
    folder = tmp_path_factory.mktemp("data")
    for name, held_out in (("train.jsonl", False), ("eval.jsonl", True)):
        argv = dataset_command("openrlhf", EXPERIMENT, str(folder / name), held_out=held_out)
        assert gem_core_main(argv[1:]) == 0
    return folder


@pytest.fixture
def ppo_trainer():
    """``openrlhf.trainer.ppo_trainer`` (the module whose ``PPOTrainer.__init__`` calls ``prepare_datasets``) with the
    plugin's patch of that name, reverted after the test."""
    import openrlhf.trainer.ppo_trainer as module

    original = module.prepare_datasets
    patch = plugin_spec.DATA_ORDER_PATCHES[0]
    assert patch.target == module.__name__
    patch.apply()
    try:
        yield module
    finally:
        assert patch.revert() and module.prepare_datasets is original


def experiment_args(data, *extra):
    """The experiment's arguments (its files: ``data``), ``extra`` appended, as the launcher parses them."""
    values = {"$MODEL": "some/model", "$DATA": str(data), "$(gem-core openrlhf agent-path)": agent_path(), "$PARAM_DTYPE": PRECISION["bf16"]["PARAM_DTYPE"]}
    argv = []
    for arg in arguments(EXPERIMENT):
        for name, value in values.items():
            arg = arg.replace(name, value)
        argv.append(arg)
    return train_ppo_ray.parse_args([*argv, *extra])


def prepare(module, args, tokenizer, seed=0):
    """``module.prepare_datasets`` as OpenRLHF's PPO trainer calls it, with OpenRLHF's strategy for ``args``; the
    loaders, the step count and each ``setup_dataloader`` call's arguments (by name, defaults filled in)."""
    from openrlhf.utils import get_strategy

    strategy = get_strategy(args)
    signature = inspect.signature(strategy.setup_dataloader)
    calls, setup = [], strategy.setup_dataloader

    def recorded(*a, **kw):
        bound = signature.bind(*a, **kw)
        bound.apply_defaults()
        calls.append(dict(bound.arguments))
        return setup(*a, **kw)

    strategy.setup_dataloader = recorded
    torch.manual_seed(seed)  # the torch generator OpenRLHF's shuffled loader draws from
    prompts, evaluation, max_steps = module.prepare_datasets(strategy, tokenizer)
    return prompts, evaluation, max_steps, calls


def seeds_played(loader) -> list[int]:
    """The start states of a prompts loader's rows, in the order it yields them (their labels' TaskSpecs)."""
    return [TaskSpec.from_json(label).seed for _sources, _prompts, labels, _images in loader for label in labels]


def test_with_the_experiments_flag_openrlhf_plays_the_reference_runs_start_states_in_order(ppo_trainer, data, tokenizer):
    args = experiment_args(data)
    assert args.data.shuffle is False  # what the experiment writes
    prompts, evaluation, max_steps, calls = prepare(ppo_trainer, args, tokenizer)
    assert len(REFERENCE) == 24 and seeds_played(prompts) == REFERENCE
    # OpenRLHF's two loaders (prompts shuffled, eval not), then the prompts rebuilt: the same dataset, batch size,
    # pin_memory, collate function, drop_last, sampler and workers as OpenRLHF's, shuffle off
    assert [c["shuffle"] for c in calls] == [True, False, False]
    first, rebuilt = calls[0], calls[2]
    assert rebuilt["replay_buffer"] is first["replay_buffer"] is prompts.dataset
    assert {k: v for k, v in rebuilt.items() if k not in ("shuffle", "replay_buffer")} == {
        k: v for k, v in first.items() if k not in ("shuffle", "replay_buffer")
    }
    assert (first["batch_size"], first["pin_memory"], first["drop_last"], first["num_workers"]) == (1, True, True, 0)
    assert (prompts.batch_size, prompts.pin_memory, prompts.drop_last, prompts.collate_fn) == (1, True, True, prompts.dataset.collate_fn)
    # the eval loader is OpenRLHF's own (built once, not shuffled: the held-out rows in order), the step count unchanged
    assert calls[1]["replay_buffer"] is evaluation.dataset
    held_out = seeds_played(evaluation)
    assert held_out == sorted(held_out) and len(held_out) == EXPERIMENT.eval_episodes
    assert max_steps == EXPERIMENT.updates * EXPERIMENT.optimizer_steps_per_update


def test_without_the_flag_openrlhfs_loader_is_untouched_and_shuffles(ppo_trainer, data, tokenizer):
    plain = experiment_args(data, "--data.shuffle", "true")
    del plain.data.shuffle  # OpenRLHF's arguments without the launcher: no such key
    for args in (experiment_args(data, "--data.shuffle", "true"), plain):
        prompts, _evaluation, _steps, calls = prepare(ppo_trainer, args, tokenizer, seed=3)
        assert [c["shuffle"] for c in calls] == [True, False]  # OpenRLHF's two loaders, nothing rebuilt
        played = seeds_played(prompts)
        assert sorted(played) == sorted(REFERENCE) and played != REFERENCE  # the same rows, shuffled
    patch = plugin_spec.DATA_ORDER_PATCHES[0]
    patch.revert()
    try:  # OpenRLHF unpatched, the same torch seed: the same order (the patch changed nothing without the flag)
        assert seeds_played(prepare(ppo_trainer, args, tokenizer, seed=3)[0]) == played
    finally:
        patch.apply()


def test_in_a_process_group_each_rank_keeps_its_rows_in_order(ppo_trainer, data, tokenizer, tmp_path):
    """With a process group up, OpenRLHF's ``setup_dataloader`` gives the loader its ``DistributedSampler``: rebuilt
    with ``shuffle=False``, still that sampler (one gloo rank, the mesh named as OpenRLHF's strategy names it)."""
    import torch.distributed as dist
    from openrlhf.utils import get_strategy
    from openrlhf.utils.distributed_sampler import DistributedSampler
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        strategy = get_strategy(experiment_args(data))
        strategy.ds_device_mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        prompts, _evaluation, _steps = ppo_trainer.prepare_datasets(strategy, tokenizer)
        assert isinstance(prompts.sampler, DistributedSampler) and prompts.sampler.shuffle is False
        assert (prompts.sampler.seed, prompts.sampler.num_replicas, prompts.sampler.drop_last) == (EXPERIMENT.seed, 1, True)
        assert seeds_played(prompts) == REFERENCE
    finally:
        dist.destroy_process_group()


def test_a_bad_value_is_one_line(capsys):
    with pytest.raises(CliError, match="--data.shuffle must be true or false, got 'maybe'"):
        train_ppo_ray.parse_args([*BASE, "--data.shuffle", "maybe"])
    assert train_ppo_ray.main([*BASE, "--data.shuffle=no"]) == 2
    err = capsys.readouterr().err
    assert err == "gem-core openrlhf train: error: --data.shuffle must be true or false, got 'no'\n"
    assert (train_ppo_ray.parse_args(BASE).data.shuffle, train_ppo_ray.parse_args([*BASE, "--data.shuffle", "False"]).data.shuffle) == (True, False)


def test_both_names_openrlhf_calls_are_patched_on_import_in_a_worker():
    """A fresh process as the launcher's Ray workers start: the setup hook imports nothing heavy; importing the async
    trainer's module (which imports the PPO trainer's halfway) patches ``prepare_datasets`` in both, each wrapping
    OpenRLHF's own function once, and the launcher's check finds it armed."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        "import sys, openrlhf_import_stubs as s\n"
        "s.install_then_arm()\n"
        "from gem_integrations.openrlhf import plugin_spec as p, train_ppo_ray as t\n"
        "heavy = [m for m in ('torch', 'openrlhf.trainer.ppo_trainer') if m in s.HOOK_MODULES]\n"
        "assert heavy == [] and p.data_order_armed() and t._data_order_armed_in_worker(), heavy\n"
        "import openrlhf.trainer.ppo_trainer_async as a, openrlhf.trainer.ppo_trainer as m\n"
        "from openrlhf.datasets.utils import blending_datasets\n"
        "assert m.blending_datasets is blending_datasets  # the dataset loader is OpenRLHF's own\n"
        "assert all(patch.applied for patch in p.DATA_ORDER_PATCHES) and p.data_order_armed() and p.PLUGIN.is_installed\n"
        "assert m.prepare_datasets._gem_rows_in_order and a.prepare_datasets._gem_rows_in_order\n"
        "assert m.prepare_datasets.__wrapped__ is a.prepare_datasets.__wrapped__\n"
        "assert not getattr(m.prepare_datasets.__wrapped__, '_gem_rows_in_order', False)\n"
        "assert m.prepare_datasets.__wrapped__.__module__ == 'openrlhf.trainer.ppo_trainer'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_launcher_stops_when_workers_lack_the_data_order_patch(monkeypatch):
    workers_answer(monkeypatch, False)  # a worker answering "not armed"
    with pytest.raises(train_ppo_ray.PatchNotActive, match="--data.shuffle false was requested"):
        train_ppo_ray.check_data_order_active()
