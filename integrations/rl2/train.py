"""Launcher: RL2's PPO trainer (``RL2.trainer.ppo``) with ReBN over turns for ``adv.estimator=reinforce``.

    torchrun --nproc_per_node=8 -m gem_integrations.rl2.train  <RL2 hydra overrides>
    gem-core rl2 train                                         <the same overrides> (one process)

It installs :data:`gem_integrations.rl2.plugin_spec.PLUGIN` (version check, then the patch of
``RL2.trainer.ppo.compute_advantages``) and runs RL2's own hydra ``main`` with the overrides, adding:

* ``+rollout.train_sampling_params.skip_special_tokens=false`` (and the test params'), unless given:
  rl-square 0.0.2 hands the env module SGLang's text, which must keep the end-of-turn token;
* ``GEM_RL2_TOKENIZER`` = ``actor.model_name`` for the 0.0.2 env module, unless already set.

Every process runs it (rank 0 computes the advantages); nothing else in RL2 changes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gem_integrations.rl2.rollout import TOKENIZER_ENV

ADDED = ("rollout.train_sampling_params.skip_special_tokens", "rollout.test_sampling_params.skip_special_tokens")


def overrides(argv: Sequence[str]) -> list[str]:
    """The hydra overrides RL2 gets: ``argv`` plus the sampling params the 0.0.2 env module needs."""
    out = list(argv)
    given = {a.lstrip("+~").split("=", 1)[0] for a in argv if "=" in a}
    for key in ADDED:
        if key not in given:
            out.append(f"+{key}=false")
    return out


def model_name(argv: Sequence[str]) -> str | None:
    """``actor.model_name`` from the overrides, if given."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "actor.model_name" and value:
            return value
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Install the ReBN patch and run ``RL2.trainer.ppo.main`` with the overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from gem_integrations.rl2.plugin_spec import PLUGIN

    PLUGIN.install()
    name = model_name(argv)
    if name and not os.environ.get(TOKENIZER_ENV):
        os.environ[TOKENIZER_ENV] = name
    from RL2.trainer import ppo

    sys.argv = [ppo.__file__, *overrides(argv)]
    ppo.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
