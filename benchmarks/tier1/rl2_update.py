"""RL2 (rl-square 0.0.2) in the Tier 1 check: the recorded batch and weights through RL2's own PPO training step, on CPU.

The configuration is the plugin's mapping of the experiment (``gem_integrations.rl2.experiment.overrides``, what
``gem-core experiment FILE --trainer rl2`` writes) with the launcher's additions (``gem_integrations.rl2.train.overrides``:
``rollout.max_turns``, ``skip_special_tokens=false``), composed by hydra with RL2's own ``ppo.yaml``; its datasets are
written by the plugin's ``gem-core make-dataset rl2`` commands (``gem_core.experiment_scripts.dataset_command``, as the script
runs them). Everything below reads the composed config. What runs is RL2's:

* ``PPOTrainer.__init__``: the actor (``Actor(config.actor, True)``: ``AutoModelForCausalLM``, RL2's FSDP wrapping
  ``prepare_dp_model`` with its auto-wrap policy, ``torch.optim.AdamW(model.parameters(), lr, weight_decay)``), the
  dataloaders (``RLDataset`` over the plugin's rows), the scheduler (``prepare_scheduler``: ``get_scheduler`` with
  ``int(warmup_ratio * n_epochs * len(dataloader) * update_per_rollout)`` warm-up steps), the reference actor when
  ``actor.kl.coef > 0``, the ``Rollout`` (the plugin's env module loaded from ``rollout.env_path``);
* ``PPOTrainer.train()`` for one step: RL2's ``Rollout.__call__``/``rollout`` (its own tokenisation of the env
  module's text, a sequence per episode, ``dynamic_filtering``, ``pack_tensor_dicts`` and ``cu_seqs``) over the
  plugin's 0.0.2 env module (``reset``/``step``: each episode played again by gem_core's runner through the bridge,
  an infra failure answered with the NaN reward marker), ``Actor.compute_logps`` (the old log-probs, the actor at
  the step's start) and the reference's, ``compute_approx_kl``, ``compute_advantages`` as the plugin patches it
  (``PLUGIN.install()``: the infra-failed row masked, ReBN over turns), ``Actor.update`` (``torch.chunk`` of the
  rows into ``update_per_rollout`` batches, each packed into minibatches of at most ``max_length_per_device``
  tokens, the clipped ratio, ``aggregate_values`` by ``avg_level``, the k-estimator KL loss over the batch's action
  tokens, ``Worker.backward``, ``clip_grad_norm_``, AdamW and the scheduler), then ``save_model`` (whose saved
  weights are the result).

Replaced, and why (nothing of the update's maths):

* **SGLang**: RL2 launches an SGLang server and router and asks them for each turn (``async_generate``); here
  ``launch_server_process``/``launch_router_process`` give a URL that nothing serves and ``async_generate`` answers
  each context with the recorded response for it (its token ids, log-probs and text, as SGLang's ``/generate``
  does); a context that is not in the recorded batch is an error. ``make_request`` (the server's memory release)
  does nothing, ``Rollout.update`` (the weight sync to the server) is not run, and
  ``prepare_environment_variables`` (``CUDA_VISIBLE_DEVICES`` and SGLang's CUDA IPC patch for the server) is not
  run. sglang, sglang_router and ring_flash_attn are import stubs (``tests/integrations/openrlhf/openrlhf_import_stubs.py``,
  as RL2's own tests use them).
* **the dataloader's draw**: RL2's shuffled dataloader of the plugin's training rows is built (it sizes the
  schedule), and the step's rows are the recorded groups' start states instead (the plugin's first row with the
  group's seed), through ``RLDataset`` and its ``collate_fn`` (``responses_per_prompt`` copies of each row).
* **the infrastructure failure**: the flagged episode's env reports ``info["infra_error"]`` (the batch's reason) at its
  last step, what a dead sandbox worker reports; the env's own state is untouched. Every GuessTheNumber episode starts
  from the same text, so RL2's rollout task of sample ``i`` is told that it plays recorded episode ``i`` (a context
  variable set around RL2's own ``Rollout.rollout``); its env and SGLang requests are that episode's.
* **the event loop**: RL2's rollout takes the thread's (``asyncio.get_event_loop()``); a fresh one is set for the run
  (a process that ran ``asyncio.run`` before, as a test that recorded the batch, has none).
* **CUDA**: ``init_device_mesh("cuda", ...)`` builds the same meshes on ``"cpu"``, ``torch.cuda.current_device()``
  answers ``"cpu"`` (:func:`tier1.cpu.one_process_group`, a one-process gloo group); ``flash_attention_2`` is
  ``sdpa`` (RL2 packs a minibatch's sequences into one row; sdpa keeps them apart by the restarting position ids,
  tested in ``tests/integrations/rl2/test_whole_step.py``), and ``llama3_flash_attn_prepare_cu_seqlens`` gives the
  one sequence-parallel rank's answer (the whole packed row).
* **FSDP** is RL2's ``FullyShardedDataParallel`` (FSDP1, ``HYBRID_SHARD``, which torch runs as ``NO_SHARD`` on one
  process) with two arguments changed: ``sync_module_states`` off (a broadcast of rank 0's weights to the other ranks:
  there are none, and FSDP1 refuses it for CPU tensors) and ``MixedPrecision`` in float32 (RL2 fixes bfloat16 in its
  code, whose rounding is far above the check's 1e-3; the plugin refuses ``training.precision = "float32"`` for that
  reason, so the check's float32 is this stand-in's, not the plugin's).
* **user settings** (:func:`user_overrides`, no semantics): ``actor.max_length_per_device`` (RL2's default is null,
  which RL2 cannot run; the plugin leaves it to the user) as the batch's longest sequence, so that RL2 packs each
  batch into several minibatches and sums their losses; the reference checkpoint (``ref_actor.model_name``: the
  actor loads ``actor/``, the reference ``ref/``, a run whose actor has moved from where it started, so the KL has a
  gradient); ``trainer.save_dir`` under the work folder; no evaluation or checkpoint (``test_freq``/``save_freq``
  null: not part of an update). Each checkpoint is copied with the test tokenizer saved by RL2's Python
  (``rl2-actor/``, ``rl2-ref/``: one saved by transformers 5 names a class RL2's transformers 4 does not have).

Observed, not changed: the batch ``Actor.update`` is handed (its advantages; row ``i`` checked to be episode ``i``'s
tokens), the rows of each of its batches (each an optimizer step; matched by tokens, action mask and advantages), the
SGLang requests (their sampling params) and RL2's logged ``actor/loss`` per step.

Found, not fixed here (the plugin's files; both in ``tests/integrations/rl2/test_same_update.py``):

* ``seq-mean-token-mean`` cannot run: the plugin maps it to ``actor.avg_level=sequence``, and rl-square 0.0.2's
  ``Actor.update`` passes its clip-ratio metric (``objective > clipped_objective``, a bool tensor) through
  ``aggregate_values``, whose sequence branch takes ``torch.finfo`` of it: every such update raises
  (:data:`SEQUENCE_LEVEL_DEFECT`). The ``aggregation`` fault and ``float_clip_metric`` cast that metric to float, so
  that RL2's own sequence aggregation runs.
* the infra-failed row is masked by the plugin's ``compute_advantages``, which RL2 calls after the old and reference
  log-probs: that row keeps its reference log-probs while ``Actor.update``'s ``logps`` are 0 there, so RL2's KL loss
  adds ``k3(0 - ref)`` over its tokens (no gradient: ``logps`` is ``(...) * action_mask``): RL2's logged
  ``actor/loss`` of that step is above the update's loss (by 0.12 on the 8-episode batch, whose true KL term is 4e-4), and
  the trainer's logged ``actor/kl`` counts the row's tokens. The weights are not affected.

RL2's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* RL2 makes one pass over a rollout (the plugin refuses ``training.epochs`` > 1): an experiment of ``k`` epochs is
  checked as ``k`` times the mini-batches in one pass (:func:`expressible`; ``same_update.py`` asks two optimizer
  steps as two epochs, RL2 makes them as ``update_per_rollout = 2``);
* rows: a sequence per episode, the batches ``torch.chunk`` of the rows in the rollout's order (no shuffle);
* old log-probs: the actor's at the step's start (``compute_logps`` when ``kl.coef > 0`` or ``update_per_rollout >
  1``; else ``logps.detach()``, ratio 1 on the one step); the rollout's are unused (``tis_coef`` 0);
* ``token`` (token-mean): each batch's token sum over the batch's action tokens; ``sequence``
  (seq-mean-token-mean): over the batch's sequences (``eos_mask``), the infra-failed row counted (the plugin masks
  its actions, not its sequence): under seq-mean its row is in the divisor, as TRL's;
* the KL with ``kl.type = "loss"``: ``kl.sum() / total_actions``, a token-mean over the batch's action tokens
  whatever ``avg_level``;
* the advantages are float32 (the plugin computes ReBN in float64 and casts to torch's default dtype);
* AdamW on every parameter (FSDP's flat parameters: no groups) with the experiment's weight decay, torch's betas
  and eps; warm-up ``lr * k / W`` (HF ``constant_with_warmup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.cpu import one_process_group
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "rl2"
ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "tests" / "integrations" / "openrlhf" / "openrlhf_import_stubs.py"
STUBBED = ("sglang", "sglang_router", "ring_flash_attn")  # GPU-only packages RL2 imports at module level
SGLANG_URL = "http://tier1-replay.invalid"  # what the stand-in launches return: nothing is served there
#: Found running RL2's own update (not fixed here: the plugin's mapping writes it): rl-square 0.0.2's ``Actor.update``
#: passes its clip-ratio metric, a bool tensor, through ``aggregate_values``, whose ``avg_level = "sequence"`` branch
#: takes ``torch.finfo`` of the tensor's dtype: every update with ``actor.avg_level=sequence`` (the plugin's
#: ``seq-mean-token-mean``) raises this.
SEQUENCE_LEVEL_DEFECT = "torch.finfo() requires a floating point input type"
#: What the last :func:`run` in this process saw (RL2's composed config, the SGLang requests and their sampling
#: params, the batch ``Actor.update`` was handed): for tests in the same process.
LAST_RUN: dict[str, Any] = {}


def expressible(experiment: Experiment) -> Experiment:
    """The experiment as RL2 runs it: ``k`` epochs of ``m`` mini-batches as one pass of ``k * m`` (see the module
    docstring); anything else as it is."""
    e = experiment
    if e.ppo_epochs > 1:
        return dataclasses.replace(e, ppo_epochs=1, mini_batches=e.mini_batches * e.ppo_epochs)
    return e


def semantics(experiment: Experiment) -> Semantics:
    """The update RL2 declares for ``experiment``: the experiment's values (not the plugin's mapping of them, which
    is what is checked) under RL2's rules (see the module docstring)."""
    return experiment_semantics(
        TRAINER,
        expressible(experiment),
        advantage_dtype="float32",
        token_mean_over="step",
        seq_rows="all",
        kl_aggregation="token-mean",
        old_logprobs="start",
        no_decay_bias_and_norm=False,
        warmup="hf",
    )


def importable() -> bool:
    """Whether RL2 is installed here (rl-square: run in ``nox -s rl2``'s Python)."""
    return importlib.util.find_spec("RL2") is not None


def install_import_stubs() -> None:
    """sglang, sglang_router and ring_flash_attn as placeholder modules (the RL2 tests' stubs; see the docstring)."""
    stubs = sys.modules.get("rl2_import_stubs")
    if stubs is None:
        spec = importlib.util.spec_from_file_location("rl2_import_stubs", STUBS)
        stubs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(stubs)
        stubs.STUBBED = STUBBED
        sys.modules["rl2_import_stubs"] = stubs
    stubs.install()


def mapped_overrides(experiment: Experiment, work: Path, model: Path) -> list[str]:
    """The plugin's hydra overrides for ``experiment`` with its shell names filled in (``$MODEL``, ``$DATA``, the env
    module's path, the bf16 rollout dtype: the SGLang engine's, which the stand-in does not use), then the launcher's
    additions, as ``gem-core rl2 train`` passes them to RL2."""
    from gem_integrations import rl2
    from gem_integrations.rl2 import train
    from gem_integrations.rl2.experiment import PRECISION, overrides

    values = {
        "$MODEL": str(model),
        "$DATA": str(work / "rl2-data"),
        "$(gem-core rl2 env-path)": rl2.env_path(),
        "$ROLLOUT_DTYPE": PRECISION["bf16"]["ROLLOUT_DTYPE"],
    }
    argv = []
    for override in overrides(experiment):
        for name, value in values.items():
            override = override.replace(name, value)
        argv.append(override)
    return train.overrides(argv, max_turns=True, warn=False)


def user_overrides(work: Path, longest: int) -> list[str]:
    """What the check adds as a user would (see the module docstring): no semantics."""
    return [
        f"actor.max_length_per_device={longest}",
        f"ref_actor.model_name={work / 'rl2-ref'}",
        f"trainer.save_dir={work / 'rl2-save'}",
        "trainer.test_freq=null",
        "trainer.save_freq=null",
    ]


def compose(argv: list[str]) -> Any:
    """RL2's ``ppo.yaml`` with ``argv``, composed by hydra as RL2's ``@hydra.main`` does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from RL2.trainer import ppo

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(ppo.__file__), "config"), version_base=None):
        return hydra_compose(config_name="ppo", overrides=list(argv))


def rl2_config(experiment: Experiment, work: Path, longest: int, overrides: dict[str, Any] | None = None) -> Any:
    """RL2's config of the check: the plugin's mapping (:func:`mapped_overrides`), the user's settings
    (:func:`user_overrides`) and ``overrides`` (``{hydra key: value}``, tests: what a default the mapping pins would
    do), composed (:func:`compose`)."""
    from gem_core.experiment_scripts import hydra_overrides

    argv = mapped_overrides(experiment, work, work / "rl2-actor") + user_overrides(work, longest) + hydra_overrides(overrides or {})
    return compose(argv)


def inject(config: Any, fault: str | None) -> None:
    """One mistake on RL2's side, in its composed config (:data:`tier1.reference.FAULTS`; ``infra`` is injected in
    the env: its failure not reported)."""
    actor = config.actor
    if fault == "lr":
        actor.lr = actor.lr * 2
    elif fault == "kl":
        actor.kl.coef = 0.0
    elif fault == "clip":
        actor.clip = actor.clip / 2
    elif fault == "aggregation":
        actor.avg_level = "sequence" if actor.avg_level == "token" else "token"
    elif fault not in (None, "infra"):
        raise ValueError(f"unknown fault {fault!r}")


def run(
    work: str | Path, experiment: Experiment, fault: str | None = None, overrides: dict[str, Any] | None = None, *, float_clip_metric: bool = False
) -> Update:
    """One training step of RL2 on the recorded batch in ``work``; ``fault`` injects one mistake on RL2's side (``lr``:
    twice the rate; ``kl``: ``actor.kl.coef`` 0; ``clip``: half the clip; ``aggregation``: the other ``avg_level``, with
    ``float_clip_metric``; ``infra``: the failed episode's failure not reported by its env, so its row trains);
    ``overrides``: RL2 config keys set over the plugin's mapping. ``float_clip_metric``: RL2's clip-ratio metric cast to
    float before ``aggregate_values`` (rl-square 0.0.2's ``avg_level = "sequence"`` raises on its bool tensor, see
    :data:`SEQUENCE_LEVEL_DEFECT`; tests: what RL2's own sequence aggregation computes once that is mended)."""
    if not importable():
        raise ModuleNotFoundError("RL2 (rl-square) is not installed here: run it in nox -s rl2's Python (.nox/rl2/bin/python)")
    os.environ.setdefault("WANDB_MODE", "disabled")
    install_import_stubs()
    work = Path(work)
    mended = _float_clip_metric() if float_clip_metric or fault == "aggregation" else contextlib.nullcontext()
    with one_process_group(), _cpu_stand_ins(), _event_loop(), mended:
        return _run(work, expressible(experiment), fault, overrides)


@contextlib.contextmanager
def _event_loop() -> Any:
    """A fresh event loop set for the thread while the run lasts, closed afterwards: RL2's rollout takes the thread's
    (``asyncio.get_event_loop()``), which a process that ran ``asyncio.run`` before (the recording, in a test) no longer
    has."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@contextlib.contextmanager
def _float_clip_metric() -> Any:
    """``Actor.update``'s ``aggregate_values`` with its bool clip-ratio tensor as float (RL2's function otherwise)."""
    import RL2.workers.actor as actor
    import torch

    real = actor.aggregate_values

    def aggregate_values(tensor: Any, *args: Any) -> Any:
        if isinstance(tensor, tuple):
            tensor = tuple(t.float() if t.dtype == torch.bool else t for t in tensor)
        return real(tensor, *args)

    with _replaced((actor, "aggregate_values", aggregate_values)):
        yield


def _run(work: Path, experiment: Experiment, fault: str | None, overrides: dict[str, Any] | None) -> Update:
    import numpy as np
    import torch
    from RL2.datasets import RLDataset
    from omegaconf import OmegaConf
    from RL2.trainer.ppo import PPOTrainer
    from transformers import AutoModelForCausalLM

    from gem_integrations.rl2.plugin_spec import PLUGIN
    from tier1.batch import load, tokenizer

    recorded = load(work)
    e = experiment
    tok = tokenizer()
    for name in ("actor", "ref"):
        _checkpoint(work, name, tok)
    _datasets(e, work)
    longest = max(len(t.full_ids()) for t in recorded.trajectories)
    config = rl2_config(e, work, longest, overrides)
    inject(config, fault)
    seen: dict[str, Any] = {"batches": [], "losses": [], "requests": [], "sampling": []}

    with _replay(recorded, seen, report_infra=fault != "infra"), _plugin_tokenizer(config), _observed(seen):
        installed = PLUGIN.is_installed
        PLUGIN.install()
        try:
            torch.manual_seed(e.seed)  # RL2's dataloader shuffles with torch's RNG (its draw is not used: see the docstring)
            trainer = PPOTrainer(config)
            step_rows = OmegaConf.merge(config.train_data, {"path": str(_recorded_rows(e, work, recorded))})
            rows = RLDataset(step_rows, trainer.actor.tokenizer)
            samples = rows.collate_fn([rows[i] for i in range(len(rows))])
            trainer.train_dataloader = [samples]
            trainer.rollout.rollout = _tagged(trainer.rollout, samples)
            trainer.rollout.update = lambda actor, step: None  # the weight sync to SGLang: no server here
            real_update = trainer.actor.update

            def update(tensor_dict: dict, step: int) -> Any:
                seen["batch"] = {k: v.detach().clone() for k, v in tensor_dict.items()}
                return real_update(tensor_dict, step)

            trainer.actor.update = update
            trainer.train()
        finally:
            if not installed:
                PLUGIN.uninstall()

    batch = seen["batch"]
    episode_of_row = _episodes_of_rows(batch, recorded)
    taken: set[int] = set()
    steps = [
        [episode_of_row[_row_of(key, batch, taken)] for minibatch in minibatches for key in minibatch if key is not None] for minibatches in seen["batches"]
    ]
    start = AutoModelForCausalLM.from_pretrained(work / "actor", dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(config.trainer.save_dir, dtype=torch.float32)
    before = dict(start.named_parameters())
    deltas = {name: (p.detach() - before[name].detach()).double().numpy() for name, p in saved.named_parameters()}
    advantages = _completion_advantages(batch, episode_of_row, recorded, tok.pad_token_id)
    dtype = str(batch["advantages"].dtype).replace("torch.", "")
    LAST_RUN.clear()
    LAST_RUN.update(seen=seen, config=config)
    stats = [{"loss": loss} for loss in seen["losses"]]
    return Update(np.asarray(advantages, dtype=np.float64), deltas, steps, dtype, stats)


def _checkpoint(work: Path, name: str, tok: Any) -> Path:
    """``work/name`` as RL2's Python loads it (``work/rl2-name``): its weights and config, and the test tokenizer saved
    by this Python's transformers."""
    out = work / f"rl2-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in (work / name).iterdir():
        if path.name in ("config.json", "generation_config.json") or path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, out / path.name)
    tok.save_pretrained(out)
    return out


def _datasets(experiment: Experiment, work: Path) -> None:
    """The plugin's two ``gem-core make-dataset rl2`` commands (the training rows, the held-out rows), run here."""
    from gem_core.cli import main
    from gem_core.experiment_scripts import dataset_command
    from gem_integrations.rl2.experiment import TRAINER as PLUGIN_TRAINER

    data = work / "rl2-data"
    data.mkdir(parents=True, exist_ok=True)
    for out, held_out in (("train.jsonl", False), ("eval.jsonl", True)):
        argv = dataset_command(PLUGIN_TRAINER, experiment, str(data / out), held_out=held_out)
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            if main(argv[1:]) != 0:
                raise RuntimeError(f"{' '.join(argv)} failed")


def _recorded_rows(experiment: Experiment, work: Path, recorded: Any) -> Path:
    """The step's rows: the plugin's first training row with each recorded group's seed, in the recorded order."""
    from gem_integrations.rl2.rollout import TASK_KEY, task_spec

    data = work / "rl2-data"
    first = json.loads((data / "train.jsonl").read_text().splitlines()[0])
    spec = task_spec(first)
    lines = []
    for trajectory in recorded.trajectories[:: experiment.group_size]:
        row = json.loads(json.dumps(first))
        row["extra_info"][TASK_KEY] = dataclasses.replace(spec, seed=trajectory.seed).to_json()
        lines.append(json.dumps(row))
    out = data / "recorded.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


# -- the stand-ins ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _replaced(*changes: tuple[Any, str, Any]) -> Any:
    """``setattr(obj, name, value)`` for each change while the block runs; the old values put back afterwards."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in changes]
    try:
        for obj, name, value in changes:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


@contextlib.contextmanager
def _cpu_stand_ins() -> Any:
    """CUDA's meshes, flash attention and FSDP's two GPU-only arguments, for the CPU (see the module docstring)."""
    import RL2.utils.data_parallelism as data_parallelism
    import RL2.utils.sequence_parallelism as sequence_parallelism
    import RL2.workers.actor as actor
    import torch
    import torch.distributed.device_mesh as device_mesh
    from transformers import AutoModelForCausalLM

    real_mesh = device_mesh.init_device_mesh
    real_fsdp = data_parallelism.FSDP
    real_precision = data_parallelism.MixedPrecision

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return real_mesh("cpu", *args, **kwargs)

    class SdpaCausalLM:
        """``AutoModelForCausalLM`` loading with ``sdpa`` where RL2 asks for ``flash_attention_2``."""

        @staticmethod
        def from_pretrained(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("attn_implementation") != "flash_attention_2":
                raise ValueError(f"RL2 asked for attention {kwargs.get('attn_implementation')!r}; the stand-in replaces flash_attention_2")
            return AutoModelForCausalLM.from_pretrained(*args, **{**kwargs, "attn_implementation": "sdpa"})

    def fsdp(module: Any, **kwargs: Any) -> Any:
        return real_fsdp(module, **{**kwargs, "sync_module_states": False})

    def float32_precision(**kwargs: Any) -> Any:
        if set(kwargs) != {"param_dtype", "reduce_dtype", "buffer_dtype"}:
            raise ValueError(f"RL2's MixedPrecision arguments changed: {sorted(kwargs)}")
        return real_precision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)

    def prepare_cu_seqlens(cu_seqlens: Any, causal: bool, rank: int, world_size: int) -> Any:
        if world_size != 1:
            raise ValueError("the CPU stand-in covers one sequence-parallel rank")
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        return cu_seqlens, cu_seqlens, longest, longest, slice(None)

    with _replaced(
        (device_mesh, "init_device_mesh", init_device_mesh),
        (actor, "AutoModelForCausalLM", SdpaCausalLM),
        (data_parallelism, "FSDP", fsdp),
        (data_parallelism, "MixedPrecision", float32_precision),
        (sequence_parallelism, "llama3_flash_attn_prepare_cu_seqlens", prepare_cu_seqlens),
    ):
        yield


#: The recorded episode an RL2 rollout task plays (set when the env module makes its env, read by the SGLang stand-in).
_EPISODE: contextvars.ContextVar[int] = contextvars.ContextVar("tier1_rl2_episode")


@contextlib.contextmanager
def _replay(recorded: Any, seen: dict[str, Any], report_infra: bool) -> Any:
    """SGLang replaced by the recorded responses, and the flagged episode's infrastructure failure reported by its env
    (with ``report_infra``), see the module docstring.

    Every GuessTheNumber episode starts from the same text, so a context does not tell which episode asks: the step's
    samples are the recorded episodes in order (:func:`_recorded_rows`, ``responses_per_prompt`` copies of each group's
    row), and RL2's rollout task of sample ``i`` plays episode ``i`` (:data:`_EPISODE`, a context variable of the task,
    set by :func:`_tagged`); each SGLang request of the task is that episode's next turn, checked token for token
    against the recorded context."""
    import RL2.workers.rollout as rollout

    from gem_core.core import Wrapper
    from gem_core.errors import INFRA_ERROR
    from gem_core.tasks import TaskSpec
    from tier1.batch import tokenizer

    tok = tokenizer()
    trajectories = recorded.trajectories
    turns_served = [0] * len(trajectories)
    real_make = TaskSpec.make_env

    class FailingAtTheEnd(Wrapper):
        """The flagged episode's env: its last step's info reports the infrastructure failure the batch recorded."""

        def __init__(self, env: Any, trajectory: Any):
            super().__init__(env)
            self.trajectory, self.steps = trajectory, 0

        def step(self, action: Any) -> Any:
            observation, reward, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            if self.steps == self.trajectory.num_turns:
                info = {**info, INFRA_ERROR: self.trajectory.infra_error}
            return observation, reward, terminated, truncated, info

    def make_env(spec: Any) -> Any:
        env = real_make(spec)
        trajectory = trajectories[_EPISODE.get()]
        if spec.seed != trajectory.seed:
            raise ValueError(f"RL2's sample of episode {_EPISODE.get()} starts from seed {spec.seed}, the recorded one from {trajectory.seed}")
        return FailingAtTheEnd(env, trajectory) if report_infra and trajectory.infra_error is not None else env

    async def async_generate(url: str, states: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        if url != SGLANG_URL:
            raise ValueError(f"RL2 asked {url} for a response; the stand-in serves {SGLANG_URL}")
        episode = _EPISODE.get()
        trajectory, t = trajectories[episode], turns_served[episode]
        if t >= trajectory.num_turns:
            raise ValueError(f"RL2 asked for turn {t + 1} of episode {episode}, which has {trajectory.num_turns}")
        turn = trajectory.turns[t]
        if list(states) != trajectory.full_ids()[: turn.context_len]:
            raise ValueError(f"RL2's context of turn {t + 1} of episode {episode} is not the recorded one ({len(states)} tokens, {turn.context_len} recorded)")
        turns_served[episode] += 1
        seen["requests"].append((episode, t))
        seen["sampling"].append(dict(sampling_params))
        triples = [(float(lp), int(token), None) for lp, token in zip(turn.logprobs, turn.response_ids)]
        meta = {"output_token_logprobs": triples, "completion_tokens": len(triples), "finish_reason": {"type": turn.finish_reason}}
        await asyncio.sleep(0)
        return {"text": tok.decode(turn.response_ids, skip_special_tokens=False), "meta_info": meta}

    def launched(*args: Any, **kwargs: Any) -> str:
        return SGLANG_URL

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    with _replaced(
        (rollout, "launch_server_process", launched),
        (rollout, "launch_router_process", launched),
        (rollout, "prepare_environment_variables", nothing),
        (rollout, "make_request", nothing),
        (rollout, "async_generate", async_generate),
        (TaskSpec, "make_env", make_env),
    ):
        yield
    unplayed = [e for e, trajectory in enumerate(trajectories) if turns_served[e] != trajectory.num_turns]
    if unplayed:
        raise ValueError(f"RL2 did not play the recorded episodes {unplayed} to their end")


def _tagged(rollout: Any, samples: list[dict[str, Any]]) -> Any:
    """RL2's ``Rollout.rollout`` (one sample's episode, run as its own task) with :data:`_EPISODE` set in that task to
    the sample's place in ``samples``."""
    real = rollout.rollout
    places = {id(sample): i for i, sample in enumerate(samples)}

    async def tagged(data: dict[str, Any], train: bool) -> Any:
        _EPISODE.set(places[id(data)])
        return await real(data, train)

    return tagged


@contextlib.contextmanager
def _plugin_tokenizer(config: Any) -> Any:
    """The 0.0.2 env module's tokenizer as the launcher gives it (``GEM_RL2_TOKENIZER`` = ``actor.model_name``), its
    cached one and the variable put back afterwards."""
    from gem_integrations.rl2 import rollout

    saved_env = os.environ.get(rollout.TOKENIZER_ENV)
    saved = rollout._SETTINGS.tokenizer
    os.environ[rollout.TOKENIZER_ENV] = str(config.actor.model_name)
    rollout._SETTINGS.tokenizer = None
    try:
        yield
    finally:
        rollout._SETTINGS.tokenizer = saved
        if saved_env is None:
            os.environ.pop(rollout.TOKENIZER_ENV, None)
        else:
            os.environ[rollout.TOKENIZER_ENV] = saved_env


@contextlib.contextmanager
def _observed(seen: dict[str, Any]) -> Any:
    """The rows of each of ``Actor.update``'s batches (RL2's split into batches and minibatches, read as it passes) and
    RL2's ``actor/loss`` of each batch (``rank0_log``'s metrics: the minibatches' losses summed per batch)."""
    import RL2.utils.sequences as sequences
    import RL2.workers.actor as actor

    real_split = sequences.tensor_dict_to_minibatches
    real_log = actor.rank0_log

    def split(worker: Any, tensor_dict: Any, pack_minibatches: bool, pair: bool) -> Any:
        out = real_split(worker, tensor_dict, pack_minibatches, pair)
        if pack_minibatches:
            for minibatches in out:
                seen["batches"].append([[_key(m, k) if int(m["eos_mask"][k].sum()) else None for k in range(m["states"].shape[0])] for m in minibatches])
        return out

    def log(metrics: dict[str, list[float]], step: int) -> None:
        if "actor/loss" in metrics:
            seen["losses"] = [float(v) for v in metrics["actor/loss"]]
        return real_log(metrics, step)

    with _replaced((sequences, "tensor_dict_to_minibatches", split), (actor, "rank0_log", log)):
        yield


# -- RL2's batch on the reference's layout -----------------------------------------------------------------


def _key(tensors: dict[str, Any], row: int) -> Any:
    """A row's tokens, action mask and advantages, one float64 vector (rows equal in all three train alike)."""
    import torch

    return torch.cat([tensors[k][row].double() for k in ("states", "action_mask", "advantages")])


def _row_of(key: Any, batch: dict[str, Any], taken: set[int]) -> int:
    """The row of RL2's batch with :func:`_key` ``key``, not ``taken`` yet (then taken)."""
    import torch

    for row in range(batch["states"].shape[0]):
        if row not in taken and torch.equal(_key(batch, row), key):
            taken.add(row)
            return row
    raise ValueError("a minibatch row that is not in the batch RL2 trained on")


def _episodes_of_rows(batch: dict[str, Any], recorded: Any) -> dict[int, int]:
    """The recorded episode of each row of RL2's batch: row ``i`` is sample ``i``'s (RL2 concatenates the samples'
    sequences in order), episode ``i``; checked by its tokens (RL2 drops a sequence's last token)."""
    rows = batch["states"].shape[0]
    if rows != len(recorded.trajectories):
        raise ValueError(f"RL2's batch holds {rows} sequences for {len(recorded.trajectories)} episodes")
    for row, trajectory in enumerate(recorded.trajectories):
        n = int(batch["eos_mask"][row].argmax()) + 1
        if batch["states"][row, :n].tolist() != trajectory.full_ids()[:-1]:
            raise ValueError(f"row {row} of RL2's batch is not the tokens of recorded episode {row}")
    return {row: row for row in range(rows)}


def _completion_advantages(batch: dict[str, Any], episode_of_row: dict[int, int], recorded: Any, pad_id: int) -> Any:
    """RL2's advantages (index j: the token at sequence position j + 1) on the reference's completion layout (rows x
    response positions of :func:`gem_core.batch.sequence_batch`)."""
    import numpy as np

    from gem_core.batch import sequence_batch

    layout = sequence_batch(recorded.trajectories, pad_id=pad_id)
    out = np.zeros(layout.response_ids.shape, dtype=np.float64)
    for row, episode in episode_of_row.items():
        prompt, n = len(layout.prompt_ids[episode]), int(layout.lengths[episode])
        out[episode, :n] = batch["advantages"][row, prompt - 1 : prompt - 1 + n].double().numpy()
    return out
