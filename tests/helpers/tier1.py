"""What the trainers' Tier 1 tests (tests/integrations/*/test_same_update.py) share: the recorded batch made once
a module from an experiment file (``python benchmarks/same_update.py``'s preparation), the experiment saved with it,
and the check that the batch can tell a wrong update from a right one (different lengths, returns of both signs, one
episode failed by the infrastructure, old log-probs and the reference model both away from the actor)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:  # same_update and tier1 are benchmarks/ scripts, not a package
    sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402
from tier1.batch import INFRA_EPISODE, load  # noqa: E402
from tier1.reference import advantages, response_logprobs, rows_of  # noqa: E402

PORTABLE = ROOT / "examples" / "experiments" / "portable.toml"
EPISODES = 8


def prepared(tmp_path_factory: Any, name: str, source: Path = PORTABLE, episodes: int = EPISODES) -> Path:
    """A fresh folder holding the recorded batch of ``episodes`` episodes of ``source`` and its weights."""
    out = tmp_path_factory.mktemp(name)
    same_update.prepare(source, out, episodes)
    return out


def experiment_of(work: Path, **changes: Any) -> Any:
    """The experiment saved with the batch in ``work``, with ``changes``."""
    return same_update.saved_experiment(work, **changes)


def assert_batch_is_sensitive(work: Path, semantics: Any, episodes: int = EPISODES) -> None:
    """The batch of whole-episode rows in ``work`` under a trainer's ``semantics``: at least three episode lengths,
    advantages past +-0.5, the failed episode's all 0, and the actor's log-probs at least 0.05 (mean) from both the
    rollout's and the reference model's."""
    import torch
    from transformers import AutoModelForCausalLM

    recorded = load(work)
    assert len({t.num_turns for t in recorded.trajectories}) >= 3
    assert recorded.failed == [i == INFRA_EPISODE for i in range(episodes)]
    rows, batch = rows_of(recorded, 0)
    adv = advantages(batch, semantics)
    assert adv.max() > 0.5 and adv.min() < -0.5 and not adv[INFRA_EPISODE].any()
    everyone = list(range(episodes))
    with torch.no_grad():
        actor = response_logprobs(AutoModelForCausalLM.from_pretrained(work / "actor"), rows, everyone)
        ref = response_logprobs(AutoModelForCausalLM.from_pretrained(work / "ref"), rows, everyone)
    mask = rows.mask.bool()
    assert (actor - rows.rollout_logprobs)[mask].abs().mean() > 0.05
    assert (actor - ref)[mask].abs().mean() > 0.05
