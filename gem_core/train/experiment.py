"""``gem-core train --experiment FILE``: what the reference trainer checks of an experiment file beyond its keys.

Every key of the file is a field of :class:`~gem_core.train.config.TrainConfig` and a flag of ``gem-core train``
of the same name (:mod:`gem_core.train.cli`); what the trainer cannot run is refused where the config is made
(:func:`gem_core.train.config.check_expressible`). Left here: the weights ``model.sha256`` names, checked before a
run starts (:func:`checked_weights`).
"""

from __future__ import annotations

import os

from gem_core.experiment import Experiment, refuse, weights_sha256
from gem_core.models import EMBEDDED_MODELS, resolve_model
from gem_core.train.config import TRAINER


def checked_weights(experiment: Experiment) -> str:
    """The local weights ``model.id`` names, their sha256 equal to ``model.sha256`` (else one line)."""
    name = experiment.model
    if name.strip().lower() in EMBEDDED_MODELS:
        name = resolve_model(name, prefer_hub=False)  # the checkpoint converted here: the weights that are checked are those trained
    if not os.path.exists(name):
        raise refuse(TRAINER, experiment, "model.sha256", f"the weights are checked where they are local, and {experiment.model!r} is not a local path")
    found = weights_sha256(name)
    if found != experiment.model_sha256:
        raise refuse(TRAINER, experiment, "model.sha256", f"the weights at {name} have sha256 {found}")
    return name
