"""Launcher: OpenRLHF's ``train_ppo_ray`` with ``rebn`` added to ``--algo.advantage.estimator``.

    python -m gem_integrations.openrlhf.train_ppo_ray  <openrlhf train_ppo_ray arguments>
    gem-core openrlhf train                            <the same arguments>

It runs OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` module as ``__main__`` (its parser, checks and
``train``), with three additions:

* ``rebn`` is one more choice of ``--algo.advantage.estimator``, with ``--algo.advantage.rebn_eps``
  (default 1e-6) and ``--algo.advantage.rebn_ddof`` (default 0);
* Ray is started before OpenRLHF would start it, with OpenRLHF's own environment variables plus
  ``GEM_OPENRLHF_TURNS=1`` (the GEM agent file then reports each turn's reward and span) and
  ``worker_process_setup_hook="gem_integrations.openrlhf.plugin_spec.setup_worker"``: every Ray worker arms
  the advantage patch, which is applied when (and only where) OpenRLHF's experience maker is imported,
  so vLLM engine actors import nothing more than OpenRLHF itself makes them;
* with ``rebn`` requested, a Ray worker is asked whether the patch is armed before training starts,
  and the run stops with an error if it is not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from typing import Any

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
ESTIMATOR_FLAG = "--algo.advantage.estimator"
SETUP_HOOK = "gem_integrations.openrlhf.plugin_spec.setup_worker"


class PatchNotActive(RuntimeError):
    """``rebn`` was requested but a Ray worker does not carry the advantage patch."""


class _Parsed(Exception):
    def __init__(self, args: Any):
        super().__init__("parsed")
        self.namespace = args


@contextlib.contextmanager
def rebn_choice() -> Iterator[None]:
    """While active, an argparse parser that defines ``--algo.advantage.estimator`` also accepts
    ``rebn`` and gets the two ``rebn`` options."""
    original = argparse._ActionsContainer.add_argument

    def add_argument(self: Any, *names: Any, **kwargs: Any) -> Any:
        if ESTIMATOR_FLAG in names and kwargs.get("choices") is not None and "rebn" not in kwargs["choices"]:
            kwargs["choices"] = [*kwargs["choices"], "rebn"]
            kwargs["help"] = (kwargs.get("help") or "") + " | rebn: ReBN, per-turn returns normalised over the batch (gem-core)"
            action = original(self, *names, **kwargs)
            original(self, "--algo.advantage.rebn_eps", type=float, default=1e-6, help="rebn: eps in (G - mean) / (std + eps)")
            original(self, "--algo.advantage.rebn_ddof", type=int, default=0, choices=(0, 1), help="rebn: 0 population std, 1 sample std")
            return action
        return original(self, *names, **kwargs)

    argparse._ActionsContainer.add_argument = add_argument
    try:
        yield
    finally:
        argparse._ActionsContainer.add_argument = original


@contextlib.contextmanager
def _argv(argv: Sequence[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = [OPENRLHF_MAIN.replace(".", "/") + ".py", *argv]
    try:
        yield
    finally:
        sys.argv = saved


def parse_args(argv: Sequence[str]) -> Any:
    """OpenRLHF's own parser (with ``rebn``) applied to ``argv``; returns its nested namespace.

    Runs OpenRLHF's ``__main__`` block up to its ``hierarchize(args)`` call and stops there.
    """
    import openrlhf.utils.config as config

    original = config.hierarchize

    def capture(args: Any) -> Any:
        raise _Parsed(original(args))

    config.hierarchize = capture
    try:
        with rebn_choice(), _argv(argv):
            runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=False)
    except _Parsed as parsed:
        return parsed.namespace
    finally:
        config.hierarchize = original
    raise RuntimeError(f"{OPENRLHF_MAIN} did not parse its arguments")


def runtime_env(extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The Ray runtime env: OpenRLHF's env vars, the turn-rewards switch and the patch's setup hook."""
    env_vars = {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        "GEM_OPENRLHF_TURNS": "1",
        **(extra_env or {}),
    }
    return {"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}


def _patch_armed_in_worker() -> bool:
    from gem_integrations.openrlhf.plugin_spec import armed

    return armed()


def check_patch_active() -> None:
    """Ask a Ray worker whether the ``rebn`` patch is armed there (it imports nothing to answer); raise
    :class:`PatchNotActive` if not."""
    import ray

    probe = ray.remote(num_cpus=0)(_patch_armed_in_worker)
    try:
        active = ray.get(probe.remote())
    except Exception as exc:  # the setup hook itself failed in the worker
        raise PatchNotActive(f"the rebn patch could not be installed in a Ray worker: {exc}") from exc
    if not active:
        raise PatchNotActive(
            "--algo.advantage.estimator rebn was requested but the Ray workers do not carry gem-core's patch of "
            "RemoteExperienceMaker.compute_advantages_and_returns (was Ray started elsewhere without the "
            f"worker_process_setup_hook {SETUP_HOOK!r}?)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse (with ``rebn``), start Ray with the patch hook, check it when ``rebn`` is asked, then train."""
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    PLUGIN.check_version()  # a clear PluginError on an OpenRLHF this plugin was not tested with
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import ray

    if not ray.is_initialized():
        ray.init(runtime_env=runtime_env())
    if args.algo.advantage.estimator == "rebn":
        check_patch_active()
    with rebn_choice(), _argv(argv):
        runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
