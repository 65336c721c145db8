"""One rank of the whole-step test: what ``torchrun -m gem_integrations.rl2.train ARGS`` runs in each
process, on CPU. It installs the CPU stand-ins below, then runs the launcher module as ``python -m``
does (``runpy``, ``__main__``), which runs RL2's own hydra ``main``: its config, ``PPOTrainer``
(``__init__``: ``Actor``, datasets, scheduler, ``Rollout``), ``train()`` (rollout through the env
module, the patched advantage step, ``Actor.update``: RL2's minibatch balancing and padding, the loss,
backward and optimizer step; ``Rollout.update``: the weight sync), ``save_model``.

STAND-INS, each for a GPU-only piece (everything else is rl-square 0.0.2's code):

* IMPORT STUB ``sglang``, ``sglang_router``, ``ring_flash_attn`` (tests/integrations/openrlhf's
  placeholder modules), with these names given CPU bodies: ``monkey_patch_torch_reductions`` (a
  no-op: it patches CUDA IPC), ``MultiprocessingSerializer.serialize`` (pickle),
  ``LocalSerializedTensor`` (a dict of the values), ``llama3_flash_attn_prepare_cu_seqlens`` (its
  result for one sequence-parallel rank: the whole packed row);
* the NCCL process group -> gloo (``initialize_global_process_group``);
* ``init_device_mesh("cuda", ...)`` -> the same mesh on ``"cpu"``; ``torch.cuda.current_device()`` ->
  ``"cpu"`` (RL2 moves every tensor there);
* ``flash_attention_2`` -> ``sdpa`` for the model (packed rows keep their sequences apart through the
  position ids; the test checks this equals separate forwards);
* FSDP (``prepare_dp_model``) -> DDP over gloo (the same gradient averaging over data-parallel ranks),
  and FSDP's parameter offload (``load_model_to_device``) -> nothing;
* the SGLang server and router processes -> the test's SGLang stand-in (``GEM_RL2_TEST_SGLANG``).

Observed (written under ``GEM_RL2_TEST_OUT`` as ``rank{R}.pt``): the batch ``Actor.update`` gets (rank
0), RL2's minibatches per update (sizes, and RL2's ``PAD_SEQUENCES``), RL2's ``wandb.log`` calls,
the env module's pending episodes and the envs made/closed, the exit code.
"""

from __future__ import annotations

import os
import pickle
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def install_stand_ins(sglang_url: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("rl2_import_stubs", HERE.parent / "openrlhf" / "openrlhf_import_stubs.py")
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    stubs.STUBBED = ("sglang", "sglang_router", "ring_flash_attn")  # IMPORT STUB: GPU-only packages
    stubs.install()

    import sglang.srt.model_executor.model_runner as model_runner
    import sglang.srt.patch_torch as patch_torch
    import sglang.srt.utils as sglang_utils
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import ring_flash_attn.llama3_flash_attn_varlen as llama3_flash_attn_varlen

    class MultiprocessingSerializer:
        @staticmethod
        def serialize(obj):
            return pickle.dumps(obj)

    def LocalSerializedTensor(values):  # noqa: N802 - SGLang's class name; a plain dict pickles anywhere
        return {"values": values}

    def prepare_cu_seqlens(cu_seqlens, causal, rank, world_size):
        assert world_size == 1, "the CPU stand-in covers one sequence-parallel rank"
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        return cu_seqlens, cu_seqlens, longest, longest, slice(None)

    patch_torch.monkey_patch_torch_reductions = lambda: None
    sglang_utils.MultiprocessingSerializer = MultiprocessingSerializer
    model_runner.LocalSerializedTensor = LocalSerializedTensor
    llama3_flash_attn_varlen.llama3_flash_attn_prepare_cu_seqlens = prepare_cu_seqlens

    real_mesh = device_mesh.init_device_mesh
    device_mesh.init_device_mesh = lambda device_type, *args, **kwargs: real_mesh("cpu", *args, **kwargs)
    torch.cuda.current_device = lambda: "cpu"

    import RL2.trainer.ppo as ppo
    import RL2.utils.offloading as offloading
    import RL2.workers.actor as actor
    import RL2.workers.base as base
    import RL2.workers.rollout as rollout
    from transformers import AutoModelForCausalLM

    ppo.initialize_global_process_group = lambda timeout_second=36000: dist.init_process_group("gloo")

    class SdpaCausalLM:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            assert kwargs.get("attn_implementation") == "flash_attention_2"
            return AutoModelForCausalLM.from_pretrained(*args, **{**kwargs, "attn_implementation": "sdpa"})

    actor.AutoModelForCausalLM = SdpaCausalLM
    base.prepare_dp_model = lambda model, mesh: torch.nn.parallel.DistributedDataParallel(model)
    offloading.load_model_to_device = base.load_model_to_device = lambda worker, device: None
    rollout.launch_server_process = lambda server_args: sglang_url
    rollout.launch_router_process = lambda worker_urls: sglang_url


def install_observers(record: dict) -> None:
    import torch
    import torch.distributed as dist
    import wandb

    import RL2.utils.sequences as sequences
    import RL2.workers.actor as actor
    from gem_core.tasks import TaskSpec

    logged = record.setdefault("wandb", [])

    def recording(real_log):
        def log(data, step=None, **kwargs):
            logged.append(({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in data.items()}, step))
            return real_log(data, step=step, **kwargs)

        return log

    real_init = wandb.init

    def init(*args, **kwargs):  # wandb.init rebinds wandb.log to the run's
        run = real_init(*args, **kwargs)
        wandb.log = recording(wandb.log)
        return run

    wandb.init = init
    wandb.log = recording(wandb.log)

    real_update = actor.Actor.update

    def update(self, tensor_dict, step):
        if dist.get_rank() == 0:
            record["batch"] = {k: v.clone() for k, v in tensor_dict.items()}
        return real_update(self, tensor_dict, step)

    actor.Actor.update = update

    real_split = sequences.tensor_dict_to_minibatches

    def split(worker, tensor_dict, pack_minibatches, pair):
        out = real_split(worker, tensor_dict, pack_minibatches, pair)
        if pack_minibatches:
            record.setdefault("minibatches", []).append([[int(m["states"].shape[0]) for m in batch] for batch in out])
            record.setdefault("pad_sequences", []).append(int(getattr(sequences, "PAD_SEQUENCES", 0)))
            record.setdefault("minibatch_actions", []).append([[int(m["action_mask"].sum()) for m in batch] for batch in out])
        return out

    sequences.tensor_dict_to_minibatches = split

    made, closed = [], []
    real_make = TaskSpec.make_env

    def make_env(spec):
        env = real_make(spec)
        close = env.close

        def counted():
            closed.append(id(env))
            close()

        env.close = counted
        made.append(id(env))
        return env

    TaskSpec.make_env = make_env
    record["envs"] = (made, closed)
    torch.manual_seed(0)  # RL2's dataloader shuffles with torch's RNG: every rank the same order


def main() -> int:
    out = Path(os.environ["GEM_RL2_TEST_OUT"])
    rank = int(os.environ["RANK"])
    install_stand_ins(os.environ["GEM_RL2_TEST_SGLANG"])
    record: dict = {}
    install_observers(record)
    sys.argv = ["gem_integrations.rl2.train", *sys.argv[1:]]
    try:
        runpy.run_module("gem_integrations.rl2.train", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    from gem_integrations.rl2 import rollout

    made, closed = record.pop("envs")
    record.update(
        code=code,
        pending=rollout.pending_episodes(),
        envs_made=len(made),
        envs_unclosed=len(set(made) - set(closed)),
        envs_closed_twice=len(closed) - len(set(closed)),
    )
    import torch

    torch.save(record, out / f"rank{rank}.pt")
    return code


if __name__ == "__main__":
    sys.exit(main())
