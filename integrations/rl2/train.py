"""Launcher: RL2's PPO trainer (``RL2.trainer.ppo``) with ReBN over turns for ``adv.estimator=reinforce``.

    torchrun --nproc_per_node=8 -m gem_integrations.rl2.train  <RL2 hydra overrides>
    gem-core rl2 train                                         <the same overrides> (one process)

It installs :data:`gem_integrations.rl2.plugin_spec.PLUGIN` (version check, then the patch of
``RL2.trainer.ppo.compute_advantages``) and runs RL2's own hydra ``main`` with the overrides (its
config directory given by path: :func:`run_rl2`), adding:

* ``rollout.max_turns`` where RL2's own config has it (rl-square 0.0.2; HEAD's ``generate`` plays whole
  episodes and has no such key), unless given: RL2 0.0.2's default is 1 and it stops an episode there
  without telling the env module, so every multi-turn episode would be trained as its first turn. The
  launcher's value, :data:`DEFAULT_MAX_TURNS` (or the dataset's largest turn limit, if higher), lets
  each env's own turn limit (or the row's ``max_turns``) end its episodes. A value you give is kept; one
  that is not an integer >= 1 is refused, one below the dataset's turn limits is warned about (RL2 then
  cuts those episodes, and the env module closes them);
* ``+rollout.train_sampling_params.skip_special_tokens=false`` (and the test params'), unless given:
  rl-square 0.0.2 hands the env module SGLang's text, which must keep the end-of-turn token;
* ``GEM_RL2_TOKENIZER`` = ``actor.model_name`` for the 0.0.2 env module, unless already set.

``+train_data.shuffle=false`` keeps the training rows in order (:mod:`gem_integrations.rl2.data_order`); a value
other than true or false is refused here in one line.

Every process runs it (rank 0 computes the advantages); nothing else in RL2 changes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import gem_core
from gem_integrations.rl2.rollout import TOKENIZER_ENV, task_spec

ADDED = ("rollout.train_sampling_params.skip_special_tokens", "rollout.test_sampling_params.skip_special_tokens")
MAX_TURNS = "rollout.max_turns"
SHUFFLE = "train_data.shuffle"  # the plugin's key (gem_integrations.rl2.data_order): checked here, before RL2 starts
DEFAULT_MAX_TURNS = 1000  # far above every registered env's own turn limit (at most 100 here)
EXIT_USAGE = 2


class LaunchError(ValueError):
    """A bad override: printed as one line, exit code 2."""


def given(argv: Sequence[str]) -> dict[str, str]:
    """The hydra overrides ``key=value`` in ``argv`` (``+``/``++`` prefixes dropped), the last one winning."""
    out: dict[str, str] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("~"):
            out[key.lstrip("+")] = value
    return out


def rl2_has_max_turns() -> bool:
    """Whether the installed RL2's own PPO config has ``rollout.max_turns`` (rl-square 0.0.2 does)."""
    from omegaconf import OmegaConf

    spec = importlib.util.find_spec("RL2")
    if spec is None or not spec.submodule_search_locations:
        return False  # the plugin's version check says what to install
    config = OmegaConf.load(Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config" / "ppo.yaml")
    return OmegaConf.select(config, MAX_TURNS, default=None) is not None


def dataset_turn_limit(path: str | None) -> int | None:
    """The largest turn limit of a local JSONL dataset's rows (each row's ``max_turns``, else its env's
    registered ``max_turns``), or None when the file is not local JSONL or no row states one."""
    if not path:
        return None
    path = path.split("@", 1)[1] if "@" in path else path  # RL2's "split@path"
    if not path.endswith((".jsonl", ".json")) or not os.path.isfile(path):
        return None
    limits: dict[str, int | None] = {}
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                spec = task_spec(json.loads(line))
            except ValueError:
                return None  # not a gem-core dataset: RL2's env module will say so
            key = spec.to_json()
            if key not in limits:
                limits[key] = spec.max_turns or _registered_max_turns(spec.env_id, spec.env_kwargs)
    found = [v for v in limits.values() if v is not None]
    return max(found) if found else None


def _registered_max_turns(env_id: str, kwargs: Mapping[str, object]) -> int | None:
    value = kwargs.get("max_turns", gem_core.spec(env_id).kwargs.get("max_turns"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def max_turns_override(argv: Sequence[str], *, warn: bool = True) -> str | None:
    """``rollout.max_turns=N`` to add to ``argv``, or None when ``argv`` sets it (checked: an integer
    >= 1, else :class:`LaunchError`; below the dataset's turn limit, one warning line on stderr)."""
    overrides = given(argv)
    limit = dataset_turn_limit(overrides.get("train_data.path"))
    if MAX_TURNS not in overrides:
        return f"{MAX_TURNS}={max(DEFAULT_MAX_TURNS, limit or 0)}"
    text = overrides[MAX_TURNS]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip():
        raise LaunchError(f"{MAX_TURNS} must be an integer >= 1, got {text!r}")
    if warn and limit is not None and value < limit:
        print(
            f"gem-core rl2 train: warning: {MAX_TURNS}={value} is below the dataset's turn limit ({limit}): "
            f"RL2 stops those episodes after {value} turn(s) and trains them cut there (drop the override to let each env end its episodes)",
            file=sys.stderr,
        )
    return None


def overrides(argv: Sequence[str], *, max_turns: bool | None = None, warn: bool = True) -> list[str]:
    """The hydra overrides RL2 gets: ``argv`` plus ``rollout.max_turns`` (``max_turns``: whether RL2's
    config has the key; default: read from the installed RL2) and the sampling params the 0.0.2 env
    module needs."""
    out = list(argv)
    keys = given(argv)
    if SHUFFLE in keys and keys[SHUFFLE].strip().lower() not in ("true", "false"):
        raise LaunchError(f"{SHUFFLE} must be true or false, got {keys[SHUFFLE]!r}")
    for key in ADDED:
        if key not in keys:
            out.append(f"+{key}=false")
    if rl2_has_max_turns() if max_turns is None else max_turns:
        extra = max_turns_override(argv, warn=warn)
        if extra is not None:
            out.append(extra)
    return out


def model_name(argv: Sequence[str]) -> str | None:
    """``actor.model_name`` from the overrides, if given."""
    return given(argv).get("actor.model_name") or None


def main(argv: Sequence[str] | None = None) -> int:
    """Install the ReBN patch and run ``RL2.trainer.ppo.main`` with the overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = overrides(argv, warn=os.environ.get("RANK", "0") == "0")
    except LaunchError as err:
        print(f"gem-core rl2 train: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    from gem_integrations.rl2.plugin_spec import PLUGIN

    PLUGIN.install()
    name = model_name(argv)
    if name and not os.environ.get(TOKENIZER_ENV):
        os.environ[TOKENIZER_ENV] = name
    run_rl2(args)
    return 0


def run_rl2(args: Sequence[str]) -> None:
    """RL2's PPO ``main`` (its hydra task, ``RL2.trainer.ppo.main.__wrapped__``) with ``args`` as hydra
    overrides, composed from RL2's own config directory given by path. Calling ``ppo.main()`` itself
    from here would make hydra look for the config as the Python package ``RL2.trainer.config`` (it
    does so for a ``main`` outside ``__main__``), which RL2 does not ship; ``python -m RL2.trainer.ppo``
    would run a second copy of the module, without the patch."""
    import hydra
    from RL2.trainer import ppo

    task = getattr(ppo.main, "__wrapped__", None)
    if task is None:
        raise RuntimeError("RL2.trainer.ppo.main is not a hydra main: this RL2 is not supported by gem-core's launcher")
    sys.argv = [ppo.__file__, *args]
    hydra.main(config_path=os.path.join(os.path.dirname(ppo.__file__), "config"), config_name="ppo", version_base=None)(task)()


if __name__ == "__main__":
    sys.exit(main())
