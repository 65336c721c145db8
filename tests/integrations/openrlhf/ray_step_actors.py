"""Stand-ins for the GPU pieces of one OpenRLHF training step, so that OpenRLHF's own ``train(args)`` runs
whole on CPU in a Ray cluster (test_openrlhf_step.py). Only the processes that host these actors import
this module (it loads OpenRLHF's trainer, so the rebn patch applies there on import).

What is a stand-in here, and for what (everything else is OpenRLHF 0.11.2's own code):

* :func:`cpu_vllm_engines` for ``create_vllm_engines``: vLLM engines on GPUs. It starts
  ``ray_actors.CPURolloutActor`` (OpenRLHF's real agent loader and ``generate_responses`` over gem_core's
  vLLM-faithful engine); ``ABORT`` names the requests the engine aborts (an infrastructure failure).
* :class:`CPUStrategy` for the DeepSpeed engine: OpenRLHF's ``DeepspeedStrategy`` with ``deepspeed.initialize``
  replaced by a torch ``AdamW`` over fp32 master copies of the bf16 weights (DeepSpeed's bf16 optimizer) and
  the same HF scheduler, and DeepSpeed's accumulation semantics (each micro-batch's loss scaled by 1/gas;
  every gas micro-batches one optimizer step, clipped to ``max_norm``); gloo instead of NCCL; HF
  ``save_pretrained`` instead of DeepSpeed's state-dict gathering.
* :class:`CPUPolicyModelActor`: OpenRLHF's real ``PolicyModelActor`` (init, forward, append, fit, save)
  given the CPU strategy; CUDA's ``current_device``/``synchronize`` answered for the CPU in its process;
  ``broadcast_to_vllm`` (CUDA IPC / NCCL weight sync into vLLM) only counted.
* :class:`CPUReferenceModelActor`: OpenRLHF's real ``ReferenceModelActor`` (the KL's starting policy, built
  where ``--algo.kl.init_coef`` is above 0) given the CPU strategy, whose ``prepare`` hands a model without an
  optimizer back as it is (DeepSpeed's evaluation engine there), in eval mode; CUDA answered for the CPU as above.
* :class:`CPUPPOTrainer`: OpenRLHF's real ``PPOTrainer`` with ``vllm.SamplingParams`` (an import stub here)
  replaced by gem_core's vLLM-faithful ``VLLMSamplingParams``; it records what it computed (advantages,
  logged metrics) into ``--ckpt.path`` for the test to read.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ray
import torch
import torch.distributed as dist
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray.launcher import ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor
from openrlhf.utils.deepspeed import DeepspeedStrategy

ABORT: set[str] = set()  # request ids the first CPU engine aborts (set by the test in the driver)
ENGINE_CALLS: list[dict] = []  # what OpenRLHF's train() asked create_vllm_engines for (driver side)
ENGINES: list = []  # their handles, kept so the test can ask them afterwards (driver side)
TRAINER_REPORT = "gem-test-trainer-report.pt"
POLICY_REPORT = "gem-test-policy-report.pt"


def _unwrapped(actor_class: Any) -> type:
    """The user class under Ray's ``@ray.remote`` wrapper."""
    return actor_class.__ray_metadata__.modified_class


def cpu_vllm_engines(num_engines, tensor_parallel_size, pretrain, seed, *args, agent_func_path=None, **kwargs) -> list:
    """STAND-IN for ``openrlhf.trainer.ray.create_vllm_engines``: CPU rollout actors with OpenRLHF's real
    ``generate_responses`` and agent loader."""
    from ray_actors import CPURolloutActor

    ENGINE_CALLS.append(
        {
            "num_engines": num_engines,
            "tensor_parallel_size": tensor_parallel_size,
            "pretrain": pretrain,
            "agent_func_path": agent_func_path,
            "max_len": args[3],
            **kwargs,
        }
    )
    engine = ray.remote(num_cpus=0)(CPURolloutActor)
    engines = [engine.remote(agent_func_path, aborted=ABORT if i == 0 else ()) for i in range(num_engines)]
    ENGINES.extend(engines)
    return engines


class CPUStrategy(DeepspeedStrategy):
    """STAND-IN for the DeepSpeed engine (see the module docstring); every other method is OpenRLHF's."""

    @classmethod
    def like(cls, strategy: DeepspeedStrategy) -> "CPUStrategy":
        """The CPU strategy for ``strategy``'s arguments (what ``openrlhf.utils.get_strategy`` builds)."""
        args = strategy.args
        return cls(
            seed=strategy.seed,
            full_determinism=strategy.full_determinism,
            max_norm=strategy.max_norm,
            micro_train_batch_size=strategy.micro_train_batch_size,
            train_batch_size=strategy.train_batch_size,
            zero_stage=strategy.stage,
            args=args,
        )

    def setup_distributed(self, timeout=None) -> None:
        import transformers
        from torch.distributed.device_mesh import init_device_mesh

        transformers.set_seed(self.seed)
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        self.world_size = dist.get_world_size()
        dp_size = self.world_size // self.ring_attn_size // self.ds_tensor_parallel_size
        self.ds_device_mesh = init_device_mesh("cpu", (dp_size, self.ring_attn_size, self.ds_tensor_parallel_size), mesh_dim_names=("dp", "sp", "tp"))
        self.setup_ring_attn(self.ds_device_mesh)
        self.accumulated_gradient = self.train_batch_size * self.ring_attn_size * self.ds_tensor_parallel_size // self.micro_train_batch_size // self.world_size
        self.micro_steps, self.optimizer_steps, self.grad_norms, self.updates = 0, 0, [], []

    def prepare(self, *models):
        from transformers.trainer import get_scheduler

        if len(models) == 1 and not isinstance(models[0], tuple):  # a model alone (ReferenceModelActor's): DeepSpeed's
            return models[0]  # evaluation engine holds it for forward passes; here the model itself
        ((model, cfg),) = models  # the actor's (model, cfg): what PolicyModelActor passes
        if cfg["optim"] != "adam":
            raise NotImplementedError("the CPU strategy replaces DeepSpeed's AdamW only")
        adam = cfg["adam"]
        _, groups = self._get_model_parameters(model, optim="adam", weight_decay=adam["weight_decay"])
        self.masters = []  # (model param, its fp32 master), as DeepSpeed's bf16 optimizer keeps them
        master_groups = []
        for group in groups:
            masters = [p.detach().float().clone() for p in group["params"]]
            self.masters.extend(zip(group["params"], masters))
            master_groups.append({**group, "params": masters})
        optimizer = torch.optim.AdamW(master_groups, lr=adam["lr"], betas=tuple(adam["betas"]), eps=adam["eps"])
        name = cfg.get("lr_scheduler", "cosine_with_min_lr")
        kwargs = {"min_lr_rate": cfg.get("min_lr_ratio", 0.1)} if name in {"cosine_with_min_lr", "cosine_warmup_with_min_lr"} else {}
        steps = cfg["scheduler_steps"]
        scheduler = get_scheduler(
            name, optimizer, num_warmup_steps=math.ceil(steps * cfg.get("lr_warmup_ratio", 0.03)), num_training_steps=steps, scheduler_specific_kwargs=kwargs
        )
        self.max_norm = cfg.get("max_norm", self.max_norm)
        return model, optimizer, scheduler

    def backward(self, loss, model, optimizer, **kwargs) -> None:
        (loss / self.accumulated_gradient).backward()  # DeepSpeed scales each micro-batch's loss by 1/gas

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs) -> None:
        self.micro_steps += 1
        if self.micro_steps % self.accumulated_gradient:
            return  # DeepSpeed's engine.step() only steps at the accumulation boundary
        for param, master in self.masters:
            master.grad = None if param.grad is None else param.grad.detach().float()
        before = [master.clone() for _, master in self.masters]
        norm = torch.nn.utils.clip_grad_norm_([m for _, m in self.masters], self.max_norm if self.max_norm > 0 else float("inf"))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            for param, master in self.masters:
                param.copy_(master)
                param.grad = None
                master.grad = None
        update = sum(float((m - b).double().pow(2).sum()) for (_, m), b in zip(self.masters, before)) ** 0.5
        self.grad_norms.append(float(norm))
        self.updates.append({"lr": lr, "grad_norm": float(norm), "master_update_norm": update})
        self.optimizer_steps += 1

    def get_grad_norm(self, model) -> float:
        return self.grad_norms[-1] if self.grad_norms else 0.0

    def save_model(self, model, tokenizer, output_dir, **kwargs) -> None:
        if self.is_rank_0():
            os.makedirs(output_dir, exist_ok=True)
            self._unwrap_model(model).save_pretrained(output_dir)
            tokenizer.save_pretrained(output_dir)


def _answer_cuda_for_cpu(device: Any) -> None:
    """STAND-IN: in this process, ``torch.cuda.current_device()`` is ``device`` and ``synchronize`` a no-op
    (OpenRLHF's actor code moves tensors to the current CUDA device and syncs after each step)."""
    torch.cuda.current_device = lambda: device
    torch.cuda.synchronize = lambda *args, **kwargs: None


class _CPUPolicyModelActor(_unwrapped(PolicyModelActor)):
    """OpenRLHF's PolicyModelActor on the CPU strategy (see the module docstring)."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        _answer_cuda_for_cpu(0)  # the replay buffer's (unused) target device is built as cuda:<current>
        super().init_model_from_pretrained(CPUStrategy.like(strategy), pretrain, max_steps, vllm_engines)
        _answer_cuda_for_cpu("cpu")
        self.broadcasts = 0
        self.steps: list[dict] = []
        self._spy_on_training_steps()

    def _spy_on_training_steps(self) -> None:
        """Record each training step's loss inputs (OpenRLHF's ``training_step`` runs unchanged)."""
        trainer = self.trainer
        real_step = trainer.training_step

        def training_step(experience, kl_ctl, step, loss_batch_info=None):
            status = real_step(experience, kl_ctl, step, loss_batch_info)
            self.steps.append(
                {
                    "sequences": experience.sequences.clone(),
                    "attention_mask": experience.attention_mask.clone(),
                    "action_mask": experience.action_mask.clone(),
                    "advantages": experience.advantages.clone(),
                    "old_action_log_probs": experience.action_log_probs.clone(),
                    "loss_batch_info": {k: (v.item() if torch.is_tensor(v) else v) for k, v in (loss_batch_info or {}).items()},
                    "policy_loss": float(status["metrics"]["policy_loss"]),
                    "optimizer_steps": self.strategy.optimizer_steps,
                }
            )
            return status

        trainer.training_step = training_step

    def _save_report(self) -> None:
        report = {
            "steps": self.steps,
            "updates": self.strategy.updates,
            "optimizer_steps": self.strategy.optimizer_steps,
            "broadcasts": self.broadcasts,
            "accumulated_gradient": self.strategy.accumulated_gradient,
            "torch_threads": torch.get_num_threads(),  # the policy actor's forward and backward
        }
        torch.save(report, os.path.join(self.strategy.args.ckpt.path, POLICY_REPORT))

    def fit(self, kl_ctl: float = 0):
        status = super().fit(kl_ctl)
        self._save_report()
        return status

    def broadcast_to_vllm(self):
        self.broadcasts += 1  # GPU only: CUDA IPC / NCCL weight sync into the vLLM engines
        self._save_report()


CPUPolicyModelActor = ray.remote(num_gpus=1)(_CPUPolicyModelActor)


class _CPUReferenceModelActor(_unwrapped(ReferenceModelActor)):
    """OpenRLHF's ReferenceModelActor on the CPU strategy (see the module docstring)."""

    def init_model_from_pretrained(self, strategy, pretrain):
        _answer_cuda_for_cpu("cpu")  # its forward moves the sequences to the current CUDA device
        super().init_model_from_pretrained(CPUStrategy.like(strategy), pretrain)


CPUReferenceModelActor = ray.remote(num_gpus=1)(_CPUReferenceModelActor)


class _CPUPPOTrainer(_unwrapped(PPOTrainer)):
    """OpenRLHF's PPOTrainer with the SamplingParams stand-in; records what its step computed."""

    def __init__(self, *args, **kwargs):
        import openrlhf.trainer.ppo_utils.samples_generator as samples_generator

        from gem_core.testing.vllm_engine import VLLMSamplingParams

        samples_generator.SamplingParams = VLLMSamplingParams  # vllm.SamplingParams (an import stub here)
        super().__init__(*args, **kwargs)
        self.recorded: dict[str, list] = {"advantage_batches": [], "logs": []}
        maker = self.experience_maker
        patched = maker.compute_advantages_and_returns  # the class's, with gem-core's patch from the setup hook

        def compute_advantages_and_returns(experiences):
            turns = [{k: e.info[k].clone() for k in ("gem_turn_rewards", "gem_turn_spans", "gem_infra_failed") if k in e.info} for e in experiences]
            out = patched(experiences)
            self.recorded["advantage_batches"].append(
                [
                    {
                        "sequences": e.sequences.clone(),
                        "attention_mask": e.attention_mask.clone(),
                        "action_mask": e.action_mask.clone(),
                        "advantages": e.advantages.clone(),
                        "returns": e.returns.clone(),
                        "rewards": e.rewards.clone(),
                        "info": {k: v.clone() for k, v in e.info.items() if torch.is_tensor(v)},
                        **t,
                    }
                    for e, t in zip(out, turns)
                ]
            )
            return out

        maker.compute_advantages_and_returns = compute_advantages_and_returns
        from gem_integrations.openrlhf.plugin_spec import PLUGIN

        self.recorded["patched"] = PLUGIN.is_installed

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        self.recorded["logs"].append({"global_step": global_step, **{k: v for k, v in (logs_dict or {}).items() if k != "generated_samples"}})
        torch.save(self.recorded, os.path.join(self.args.ckpt.path, TRAINER_REPORT))
        return super().save_logs_and_checkpoints(global_step, logs_dict, client_states)


CPUPPOTrainer = ray.remote(_CPUPPOTrainer)

__all__ = ["ABORT", "CPUPPOTrainer", "CPUPolicyModelActor", "CPUReferenceModelActor", "CPUStrategy", "ENGINE_CALLS", "cpu_vllm_engines"]
