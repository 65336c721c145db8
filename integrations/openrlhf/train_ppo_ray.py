"""Launcher: OpenRLHF's ``train_ppo_ray`` with ``rebn`` added to ``--algo.advantage.estimator``.

    python -m gem_integrations.openrlhf.train_ppo_ray  <openrlhf train_ppo_ray arguments>
    gem-core openrlhf train                            <the same arguments>

It runs OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` module as ``__main__`` (its parser, checks and
``train``), with these additions:

* ``rebn`` is one more choice of ``--algo.advantage.estimator``, with ``--algo.advantage.rebn_eps``
  (default 1e-6) and ``--algo.advantage.rebn_ddof`` (default 0);
* ``--data.shuffle {true,false}`` (default ``true``, OpenRLHF's shuffled prompt rows): ``false`` keeps the prompt
  rows in the dataset's order (:mod:`gem_integrations.openrlhf.data_order`, a patch armed by the same hook); a value
  that is not true or false is one error line (exit 2);
* Ray is started before OpenRLHF would start it, with OpenRLHF's own environment variables plus
  ``GEM_OPENRLHF_TURNS=1`` (the GEM agent file then reports each turn's reward and span) and
  ``worker_process_setup_hook="gem_integrations.openrlhf.plugin_spec.setup_worker"``: every Ray worker arms
  the advantage patch, which is applied when (and only where) OpenRLHF's experience maker is imported,
  so vLLM engine actors import nothing more than OpenRLHF itself makes them;
* with ``rebn`` requested, a Ray worker is asked whether the patch is armed before training starts,
  and the run stops with an error if it is not; with ``--data.shuffle false``, likewise for the data-order patch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from gem_core.cli_support import EXIT_USAGE, CliError
from gem_integrations.openrlhf import data_order

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
def shuffle_option() -> Iterator[None]:
    """While active, an argparse parser that defines ``--data.prompt_dataset`` also gets ``--data.shuffle``."""
    original = argparse._ActionsContainer.add_argument

    def add_argument(self: Any, *names: Any, **kwargs: Any) -> Any:
        action = original(self, *names, **kwargs)
        if data_order.ANCHOR in names and data_order.FLAG not in self._option_string_actions:
            original(
                self,
                data_order.FLAG,
                type=data_order.parse_shuffle,
                default=True,
                metavar="{true,false}",
                help="false: the prompt rows in the dataset's order, not shuffled (gem-core; default true, OpenRLHF's shuffle)",
            )
        return action

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

    Runs OpenRLHF's ``__main__`` block up to its ``hierarchize(args)`` call and stops there. A bad
    ``--data.shuffle`` value raises :class:`~gem_core.cli_support.CliError` (one line, not OpenRLHF's usage).
    """
    import openrlhf.utils.config as config

    original = config.hierarchize

    def capture(args: Any) -> Any:
        raise _Parsed(original(args))

    config.hierarchize = capture
    try:
        with rebn_choice(), shuffle_option(), _argv(argv):
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


def _data_order_armed_in_worker() -> bool:
    from gem_integrations.openrlhf.plugin_spec import data_order_armed

    return data_order_armed()


def _ask_worker(probe_function: Any, what: str) -> bool:
    """``probe_function()`` run in a Ray worker (it imports nothing to answer)."""
    import ray

    probe = ray.remote(num_cpus=0)(probe_function)
    try:
        return bool(ray.get(probe.remote()))
    except Exception as exc:  # the setup hook itself failed in the worker
        raise PatchNotActive(f"the {what} patch could not be installed in a Ray worker: {exc}") from exc


def check_patch_active() -> None:
    """Ask a Ray worker whether the ``rebn`` patch is armed there (it imports nothing to answer); raise
    :class:`PatchNotActive` if not."""
    active = _ask_worker(_patch_armed_in_worker, "rebn")
    if not active:
        raise PatchNotActive(
            "--algo.advantage.estimator rebn was requested but the Ray workers do not carry gem-core's patch of "
            "RemoteExperienceMaker.compute_advantages_and_returns (was Ray started elsewhere without the "
            f"worker_process_setup_hook {SETUP_HOOK!r}?)"
        )


def check_data_order_active() -> None:
    """Ask a Ray worker whether the data-order patch (``--data.shuffle false``) is armed there; raise
    :class:`PatchNotActive` if not."""
    if not _ask_worker(_data_order_armed_in_worker, "data-order"):
        raise PatchNotActive(
            f"{data_order.FLAG} false was requested but the Ray workers do not carry gem-core's patch of OpenRLHF's "
            f"prepare_datasets (was Ray started elsewhere without the worker_process_setup_hook {SETUP_HOOK!r}?)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse (with ``rebn`` and ``--data.shuffle``), start Ray with the patch hook, check it where ``rebn`` or
    ``--data.shuffle false`` is asked, then train."""
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    PLUGIN.check_version()  # a clear PluginError on an OpenRLHF this plugin was not tested with
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except CliError as err:
        print(f"gem-core openrlhf train: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    import ray

    if not ray.is_initialized():
        ray.init(runtime_env=runtime_env())
    if args.algo.advantage.estimator == "rebn":
        check_patch_active()
    if not data_order.shuffles(args):
        check_data_order_active()
    with rebn_choice(), shuffle_option(), _argv(argv):
        runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
