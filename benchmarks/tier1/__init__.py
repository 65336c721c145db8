"""Tier 1 of cross-framework consistency (issue 64): the same recorded batch and the same starting weights give
the same update in every trainer.

    python benchmarks/same_update.py --experiment examples/experiments/portable.toml --python trl=.nox/trl/bin/python

* :mod:`tier1.batch` records a batch from an experiment file, deterministically: the experiment's env played by
  scripted strategies of different skill (episodes of different lengths, turns of positive and negative
  advantage), one episode flagged as failed by the infrastructure, the tiny test model as the policy's weights
  (its log-probs at the played tokens, perturbed, are the rollout's), and a reference model that differs from
  the actor (the actor is the reference moved by a fixed random step), saved as Hugging Face checkpoints.
* :mod:`tier1.reference` computes the update from that batch with a trainer's *declared* semantics
  (:class:`~tier1.reference.Semantics`: advantages by gem_core's estimator, loss aggregation, rows, clip, KL,
  old log-probs, mini-batches, epochs, AdamW), written out readably, and compares a trainer's result with it.
* one file per trainer, ``tier1/<trainer>_update.py``: ``semantics(experiment)`` (what the trainer declares,
  imports nothing of the trainer) and ``run(work, experiment, fault)``, which feeds the batch and weights
  through the trainer's own advantage, loss, backward and optimizer code, in the trainer's own virtualenv.
  Today: ``trl``, ``openrlhf``, ``oat``, ``roll``, ``verl``, ``rl2``. Adding a trainer is one file and one entry in :data:`tier1.reference.TRAINERS`.

Why here and not in ``gem_core/``: the check needs the test tokenizer and the tiny model of
``gem_core.testing`` and runs each trainer in its own Python (as ``benchmarks/cross_framework.py`` does), and
product code must not import test helpers; so it is a benchmark a user runs from a clone, like the others, and
the tests import it from ``benchmarks/``.
"""
