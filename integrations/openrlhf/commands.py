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
        if "-h" in argv or "--help" in argv:
            print(TRAIN_HELP_WITHOUT_OPENRLHF)
            return 0
        print(f"gem-core: error: {NOT_INSTALLED}", file=sys.stderr)
        return 2
    from gem_integrations.openrlhf import train_ppo_ray

    return train_ppo_ray.main(list(argv))


NOT_INSTALLED = "OpenRLHF is not installed here: pip install -e '.[openrlhf]' in the clone"

# What `gem-core openrlhf train --help` shows where OpenRLHF is absent: the options gem-core adds, and where the
# rest come from. With OpenRLHF installed, --help is OpenRLHF's own parser's, these options included.
TRAIN_HELP_WITHOUT_OPENRLHF = f"""\
usage: gem-core openrlhf train [OPENRLHF TRAIN_PPO_RAY OPTIONS ...]

Run OpenRLHF's openrlhf.cli.train_ppo_ray with ReBN. Every option goes to OpenRLHF's own parser; its full
list (--actor.model_name_or_path, --data.prompt_dataset, --rollout.*, ...) is shown here once OpenRLHF is
installed. {NOT_INSTALLED}.

options gem-core adds or needs:
  --algo.advantage.estimator rebn
                        ReBN: per-turn discounted returns normalised over the batch (one more choice
                        beside OpenRLHF's own estimators)
  --algo.advantage.gamma G
                        OpenRLHF's discount, over turns for rebn (e.g. 0.9)
  --algo.advantage.rebn_eps EPS
                        rebn: eps in (G - mean) / (std + eps) (default 1e-6)
  --algo.advantage.rebn_ddof {{0,1}}
                        rebn: 0 population std, 1 sample std (default 0)
  --data.shuffle {{true,false}}
                        false: the prompt rows in the dataset's order (default true: OpenRLHF's shuffle)
  --train.agent_func_path "$(gem-core openrlhf agent-path)"
                        the GEM agent file: each episode played by gem_core's rollout runner
  --data.prompt_dataset FILE --data.input_key prompt --data.label_key label
                        a file of `gem-core make-dataset openrlhf`
"""

# `gem-core openrlhf train ARGS`: gem-core's CLI hands ARGS to these untouched (see gem_core.cli._passthrough).
PASSTHROUGH = {"train": train}
