"""Which precision a run trains in where it is told "auto": the rule ``gem-core train`` follows
(``TrainConfig.precision="auto"``) and every script ``gem-core experiment`` writes for an experiment whose
``training.precision`` is ``"auto"``, so that one experiment trains at the same precision in every trainer on
the same machine.

``auto`` is ``$GEM_PRECISION`` where it is set (:data:`ENV`). The two precisions an experiment names
(:data:`PRECISIONS`):

* ``bf16``: mixed precision, the update's forward and backward computed in bfloat16 with the weights'
  float32 master copy and the optimizer state in float32 (each trainer's own mixed precision: autocast,
  FSDP's or DeepSpeed's); the rollout generates with bfloat16 weights (the trainers' vLLM in bfloat16;
  ``gem-core train``'s a bfloat16 copy of the model, :meth:`gem_core.train.trainer.Trainer.rollout_model`);
* ``float32``: the update in float32 throughout.

torch is optional in gem_core (the envs need none), so it is imported where the CUDA device is asked about.
"""

from __future__ import annotations

import os

#: What ``training.precision`` names; ``auto`` is :func:`auto_precision` where the run starts.
PRECISIONS = ("auto", "bf16", "float32")
#: The environment variable that decides ``auto`` where it is set (``bf16`` or ``float32``), e.g. to run every
#: trainer of a comparison in the precision the slowest one can run in.
ENV = "GEM_PRECISION"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """This CPU's instruction-set flags (``cpuinfo``'s first ``flags`` line; none where there is no such file)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            return next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return []


#: The flags that pick the CPU kernels a run's matmuls take, so its last bits: two machines that differ in one
#: compute other weights from the same run (bf16 most of all: AMX tiles and AVX512-BF16 round differently).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def kernel_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """Which of :data:`KERNEL_FLAGS` this CPU has: what a record of weights computed here names its machine by."""
    flags = set(cpu_flags(cpuinfo))
    return [flag for flag in KERNEL_FLAGS if flag in flags]


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX-BF16, read from ``cpuinfo``'s flags;
    False where there is no such file): there bf16 autocast makes the update's matmuls faster (the default
    run's training forward and backward about 1.35x on two cores), elsewhere slower (emulated)."""
    flags = cpu_flags(cpuinfo)
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_by_default(device_type: str) -> bool:
    """Whether a run on ``device_type`` ("cuda", "cpu", ...) trains in bf16 when it is not told: where the device
    computes in bfloat16 (a CUDA device that supports it; a CPU with :func:`cpu_has_bf16`)."""
    if device_type == "cuda":
        import torch

        return bool(torch.cuda.is_bf16_supported())
    return device_type == "cpu" and cpu_has_bf16()


def auto_precision(device_type: str) -> str:
    """``auto`` for a run on ``device_type``: ``$GEM_PRECISION`` where it is set, else ``bf16`` where the device
    computes in bfloat16 (:func:`bf16_by_default`), ``float32`` elsewhere. A ``$GEM_PRECISION`` that is neither
    is a ValueError naming it."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        if chosen not in ("bf16", "float32"):
            raise ValueError(f"{ENV} must be bf16 or float32, got {chosen!r}")
        return chosen
    return "bf16" if bf16_by_default(device_type) else "float32"


def machine_precision() -> str:
    """``auto`` on this machine (:func:`auto_precision` of its training device: CUDA if torch sees one, else the
    CPU): what a written script decides ``auto`` with."""
    try:
        import torch
    except ImportError:  # no torch: no CUDA device to train on
        device = "cpu"
    else:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return auto_precision(device)


if __name__ == "__main__":  # the written scripts' `python -m gem_core.precision`
    import sys

    try:
        print(machine_precision())
    except ValueError as exc:
        sys.exit(f"gem_core.precision: {exc}")
