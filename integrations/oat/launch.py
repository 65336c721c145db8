"""Launcher: oat's multi-turn PPO with the GEM actor and ReBN.

    python -m gem_integrations.oat.launch --pretrain Qwen/Qwen3-1.7B --gem-env game:GuessTheNumber-v0 \
        --gamma 0.9 --critic-type drgrpo --rollout-batch-size 128 ...
    gem-core oat train <the same arguments>

oat's own arguments (``PPOArgs``, parsed by oat's ``get_default_args``) plus :class:`GemArgs`'
``--gem-*``; :func:`~gem_integrations.oat.advantage.rebn_args` sets the ReBN options, then oat's
``default_args_validation``, ``get_program`` and launchpad run :class:`GemLearner` and :class:`GemActor`
as oat's own ``run_*`` scripts do. oat 0.2.x is checked first (the plugin base).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def build_args(argv: Sequence[str]) -> object:
    """oat's and the GEM actor's arguments from ``argv``, with the ReBN settings applied."""
    from gem_integrations.oat.args import GemArgs
    from gem_integrations.oat.advantage import rebn_args
    from oat.args import default_args_validation, get_default_args

    saved = sys.argv
    sys.argv = [saved[0] if saved else "gem_integrations.oat.launch", *argv]
    try:
        args = get_default_args(GemArgs)
    finally:
        sys.argv = saved
    if not args.gem_env and not args.gem_dataset:
        raise SystemExit("gem-core oat train: give --gem-env ID [ID ...] or --gem-dataset FILE (gem-core make-dataset oat)")
    args.algo = "PPO"
    args.num_samples = 1  # one response per request: a group is episodes from one state, not vLLM's n
    # oat's evaluation generates for its --prompt-data prompts and scores them with its --oracle; the GEM
    # actor has neither (oat's RewardActor would call a None oracle at the first evaluation)
    args.eval_steps = -1
    args = rebn_args(args)
    return default_args_validation(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Check oat's version, parse the arguments and launch oat's program."""
    from gem_integrations.oat.plugin_spec import PLUGIN

    PLUGIN.check_version()
    args = build_args(list(sys.argv[1:] if argv is None else argv))
    import launchpad as lp
    from gem_integrations.oat.rollout import GemActor
    from gem_integrations.oat.advantage import GemLearner
    from oat.interface import get_program

    program, local_resources = get_program(args, GemLearner, GemActor)
    lp.launch(program, launch_type=args.launch_type, local_resources=local_resources, terminal="current_terminal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
