"""``gem-core openrlhf ...``: ``agent-path`` (the agent file for ``--train.agent_func_path``) and
``train`` (OpenRLHF's train_ppo_ray with ``rebn``). Imports nothing from OpenRLHF until ``train`` runs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``gem-core openrlhf``."""
    actions = parser.add_subparsers(dest="openrlhf_command", metavar="ACTION")
    actions.required = True
    path = actions.add_parser("agent-path", help="print the GEM agent file's path, for --train.agent_func_path")
    path.set_defaults(openrlhf_main=_agent_path)
    train = actions.add_parser(
        "train",
        add_help=False,  # every argument, --help included, goes to OpenRLHF's own parser
        help="run openrlhf.cli.train_ppo_ray with 'rebn' added to --algo.advantage.estimator",
    )
    train.add_argument("openrlhf_args", nargs=argparse.REMAINDER)
    train.set_defaults(openrlhf_main=_train)


def main(args: argparse.Namespace) -> int:
    return int(args.openrlhf_main(args))


def _agent_path(args: argparse.Namespace) -> int:
    from gem_integrations.openrlhf import agent_path

    print(agent_path())
    return 0


def _train(args: argparse.Namespace) -> int:
    return train(args.openrlhf_args)


def train(argv: list[str]) -> int:
    """``gem-core openrlhf train ARGS``: ARGS go untouched to the launcher (argparse's REMAINDER cannot
    take arguments that start with ``--`` in a subcommand, so gem-core's main calls this directly)."""
    import importlib.util
    import sys

    if importlib.util.find_spec("openrlhf") is None:
        print("gem-core: error: OpenRLHF is not installed here (pip install 'gem-core[openrlhf]')", file=sys.stderr)
        return 2
    from gem_integrations.openrlhf import train_ppo_ray

    return train_ppo_ray.main(list(argv))


# `gem-core openrlhf train ARGS`: gem-core's CLI hands ARGS to these untouched (see gem_core.cli._passthrough).
PASSTHROUGH = {"train": train}
