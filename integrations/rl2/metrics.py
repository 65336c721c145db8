"""What the RL2 env module counts for the trainer's metrics, and how rl-square 0.0.2 learns of an
infrastructure failure.

The env module (:mod:`gem_integrations.rl2.rollout`) runs in RL2's rank-0 process, where RL2 also
computes the advantages; the launcher's advantage step (:mod:`gem_integrations.rl2.advantage`) logs
:func:`pop` with RL2's ``wandb.log`` at each training step:

* ``gem/infra_failed_episodes``: episodes the infrastructure failed (``Trajectory.infra_error``: an
  engine abort, a dead sandbox or env worker; DESIGN.md contract 8), kept out of the loss and of ReBN;
* ``gem/abandoned_episodes``: episodes RL2 stopped before they ended (0.0.2's ``rollout.max_turns``),
  which the env module then closed;
* ``gem/finished_episodes`` and ``gem/succeeded_episodes``: episodes that ended (neither infra-failed nor
  abandoned), and of those the ones the env scored a success (``Trajectory.success``); with at least one
  finished, ``gem/success_rate`` is their ratio (the batch's success rate: TRL's ``gem/success_rate``, gem-core
  train's ``success_rate``).

rl-square 0.0.2 builds its batch itself from SGLang's tokens and the ``reward`` of each ``step``
answer, so the only per-episode channel into its tensors is that reward: an infra-failed episode's
last step answers :data:`INFRA_REWARD` (NaN), and the advantage step masks every row of a trajectory
holding it (action mask and rewards 0) before any estimator runs. The env module sends the marker
only while that advantage step is installed (else 0.0 and a warning), so RL2 never sees a NaN it
would train on.
"""

from __future__ import annotations

INFRA_FAILED = "gem/infra_failed_episodes"
ABANDONED = "gem/abandoned_episodes"
FINISHED = "gem/finished_episodes"
SUCCEEDED = "gem/succeeded_episodes"
SUCCESS_RATE = "gem/success_rate"
INFRA_REWARD = float("nan")

_COUNTS: dict[str, int] = {INFRA_FAILED: 0, ABANDONED: 0, FINISHED: 0, SUCCEEDED: 0}


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to the counter ``name`` (:data:`INFRA_FAILED`, :data:`ABANDONED`, :data:`FINISHED` or
    :data:`SUCCEEDED`)."""
    if name not in _COUNTS:
        raise KeyError(f"unknown RL2 episode counter {name!r}; known: {', '.join(_COUNTS)}")
    _COUNTS[name] += n


def count_outcome(success: bool) -> None:
    """An episode that ended (not infra-failed, not abandoned): :data:`FINISHED`, and :data:`SUCCEEDED` if the
    env scored it a success."""
    count(FINISHED)
    if success:
        count(SUCCEEDED)


def pop() -> dict[str, float]:
    """The counts since the last call (then reset to 0), as metrics, with :data:`SUCCESS_RATE` where an
    episode finished."""
    out = {name: float(value) for name, value in _COUNTS.items()}
    if _COUNTS[FINISHED]:
        out[SUCCESS_RATE] = _COUNTS[SUCCEEDED] / _COUNTS[FINISHED]
    for name in _COUNTS:
        _COUNTS[name] = 0
    return out


def peek() -> dict[str, int]:
    """The counts since the last :func:`pop`, left as they are."""
    return dict(_COUNTS)
