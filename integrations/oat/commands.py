"""``gem-core oat train ARGS``: oat's PPO launcher with the GEM actor and ReBN (:mod:`.launch`).
Imports nothing from oat until ``train`` runs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``gem-core oat``."""
    actions = parser.add_subparsers(dest="oat_command", metavar="ACTION")
    actions.required = True
    train = actions.add_parser(
        "train", add_help=False, help="run oat's multi-turn PPO learner with the GEM actor and ReBN (oat's own arguments plus --gem-env/--gem-dataset)"
    )
    train.add_argument("oat_args", nargs=argparse.REMAINDER)
    train.set_defaults(oat_main=lambda args: train_main(args.oat_args))


def main(args: argparse.Namespace) -> int:
    return int(args.oat_main(args))


def train_main(argv: list[str]) -> int:
    """``gem-core oat train ARGS``: the arguments go untouched to the launcher."""
    from gem_integrations.oat import launch

    return launch.main(list(argv))


PASSTHROUGH = {"train": train_main}
