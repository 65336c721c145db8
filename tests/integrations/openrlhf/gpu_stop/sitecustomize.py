"""TEST SHIM (tests only, never installed): lets an example script run on a CPU machine up to OpenRLHF's
first GPU request, and reports where it stopped.

Put this folder on ``PYTHONPATH`` with ``GEM_TEST_GPU_STOP=1``. Every Python process then (1) installs the
``vllm``/``deepspeed``/``flash_attn`` import stubs (``openrlhf_import_stubs``: GPU-only packages, absent
here) and (2) replaces ``ray.util.placement_group.placement_group``, the call with which OpenRLHF's
``train()`` reserves GPUs for the colocated actor, reference and vLLM engines, by one that prints
``GEM-TEST-GPU-STOP {json}`` (the bundles asked for and the parsed arguments ``train()`` got) and exits
with status 97. On a CPU-only Ray cluster the real call would wait for GPUs forever.
"""

from __future__ import annotations

import os
import sys

STOP_STATUS = 97
MARK = "GEM-TEST-GPU-STOP "


def _report(bundles, strategy, frame) -> dict:
    import argparse

    import ray

    args = frame.f_locals.get("args")
    built = frame.f_locals.get("strategy")
    ns = lambda value: vars(value) if hasattr(value, "__dict__") else value  # noqa: E731
    return {
        "bundles": bundles,
        "pg_strategy": strategy,
        "caller": f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}",
        "caller_file": frame.f_code.co_filename,
        "deepspeed_strategy": type(built).__name__ if built is not None else None,
        "ray_initialized": ray.is_initialized(),
        "rebn_choice_active": argparse._ActionsContainer.add_argument.__module__ != "argparse",
        "args": {
            "advantage": ns(args.algo.advantage),
            "kl_init_coef": args.algo.kl.init_coef,
            "actor": {"model": args.actor.model_name_or_path, "num_nodes": args.actor.num_nodes, "num_gpus_per_node": args.actor.num_gpus_per_node},
            "agent_func_path": args.train.agent_func_path,
            "colocate_all": args.train.colocate_all,
            "data": {
                "prompt_dataset": args.data.prompt_dataset,
                "input_key": args.data.input_key,
                "label_key": args.data.label_key,
                "max_len": args.data.max_len,
            },
            "n_samples_per_prompt": args.rollout.n_samples_per_prompt,
            "vllm": {"num_engines": args.vllm.num_engines, "tensor_parallel_size": args.vllm.tensor_parallel_size},
            "ckpt_path": args.ckpt.path,
            "remote_url": args.reward.remote_url,
        },
    }


def _stop_at_placement_group(module) -> None:
    def placement_group(bundles, strategy="PACK", *rest, **kwargs):
        import json

        report = _report(bundles, strategy, sys._getframe(1))
        print(MARK + json.dumps(report, default=str), flush=True)
        raise SystemExit(STOP_STATUS)

    module.placement_group = placement_group


if os.environ.get("GEM_TEST_GPU_STOP") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import openrlhf_import_stubs

    openrlhf_import_stubs.install()
    from gem_core.plugins import when_imported

    when_imported("ray.util.placement_group", _stop_at_placement_group)
