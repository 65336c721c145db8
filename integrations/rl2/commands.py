"""``gem-core rl2 ...``: ``env-path`` (the env module for ``rollout.env_path``) and ``train`` (RL2's PPO
trainer with ReBN). Imports nothing from RL2 until ``train`` runs."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of ``gem-core rl2``."""
    actions = parser.add_subparsers(dest="rl2_command", metavar="ACTION")
    actions.required = True
    path = actions.add_parser("env-path", help="print the GEM env module's path, for rollout.env_path")
    path.set_defaults(rl2_main=_env_path)
    train = actions.add_parser("train", add_help=False, help="run RL2's PPO trainer (RL2.trainer.ppo) with ReBN over turns for adv.estimator=reinforce")
    train.add_argument("rl2_args", nargs=argparse.REMAINDER)
    train.set_defaults(rl2_main=lambda args: train_main(args.rl2_args))


def main(args: argparse.Namespace) -> int:
    return int(args.rl2_main(args))


def _env_path(args: argparse.Namespace) -> int:
    from gem_integrations.rl2 import env_path

    print(env_path())
    return 0


def train_main(argv: list[str]) -> int:
    """``gem-core rl2 train OVERRIDES``: hydra overrides go untouched to the launcher."""
    from gem_integrations.rl2 import train

    return train.main(list(argv))


PASSTHROUGH = {"train": train_main}
