"""gem-core for oat (``pip install -e '.[oat]'``; PyPI's ``oat-llm`` 0.2.x needs Python < 3.11 and pins
vllm, deepspeed and flash-attn: on CPU it is installed ``--no-deps`` with its light deps).

* :mod:`.rollout`: :class:`~.rollout.GemActor`, oat's ``PPOMultiTurnActor`` whose ``collect_experience``
  plays GEM episodes on gem_core's runner with oat's own vLLM engine as the policy and returns episodes
  of ``oat.types.Transition`` (:func:`~.rollout.transitions`).
* :mod:`.advantage`: ReBN in oat's ``PPOMultiTurnLearner`` (:func:`~.advantage.rebn_args`: no critic,
  discounted turn returns with ``gamma``, global whitening; :class:`~.advantage.GemLearner` for
  normalising before oat's subsampling instead of after).
* :mod:`.launch`: ``python -m gem_integrations.oat.launch`` (or ``gem-core oat train``): oat's own
  arguments plus ``--gem-env``/``--gem-dataset``.
* :mod:`.dataset`: ``gem-core make-dataset oat --env ID --out train.jsonl`` (task-spec rows).

Nothing here imports oat until it is used.
"""

from __future__ import annotations
