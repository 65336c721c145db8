"""OpenRLHF's prompt rows in the dataset's order, where the launcher's ``--data.shuffle false`` asks for it.

OpenRLHF 0.11.2 builds its prompts loader in ``openrlhf.trainer.ppo_trainer.prepare_datasets(strategy, tokenizer)``
with ``strategy.setup_dataloader(prompts_dataset, 1, True, True, ...)``: the fourth argument is ``shuffle=True``,
with no switch (the rows drawn by torch's sampler, or by OpenRLHF's ``DistributedSampler`` seeded by
``--train.seed`` where a process group is up). ``blending_datasets`` keeps a single file's rows in order (one dataset
is concatenated as it is; ``--data.prompt_probs`` interleaves, which for one dataset takes its rows in turn), and
``--data.max_samples`` keeps the first rows. An experiment's rows are already the run's start states in the order
every trainer plays them (:func:`gem_core.experiment.update_start_seeds`), so the experiment's arguments add
``--data.shuffle false`` (an option the launcher adds to OpenRLHF's parser, default ``true``), and this replacement
of ``prepare_datasets`` then rebuilds the prompts loader OpenRLHF made, through the same
``strategy.setup_dataloader``, from the same dataset, batch size, ``pin_memory``, collate function, ``drop_last`` and
worker count, with ``shuffle=False`` (where a process group is up, ``setup_dataloader`` then gives it a
``DistributedSampler`` with ``shuffle=False``: each rank its own rows, in order). Without the option, or with
``true``, OpenRLHF's loaders are returned as OpenRLHF made them; the eval loader (never shuffled) is never touched.

``prepare_datasets`` is called by name from ``PPOTrainer.__init__`` in its own module and from
``PPOTrainerAsync``'s trainer in ``openrlhf.trainer.ppo_trainer_async``, which imports it by name: both modules'
names are patched (``gem_integrations.openrlhf.plugin_spec.DATA_ORDER_PATCHES``), each right after that module is
imported. A replacement wrapping another one wraps OpenRLHF's own function instead, so the loader is rebuilt once.

Importing this module imports neither torch nor OpenRLHF.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from gem_core.cli_support import CliError

#: The launcher's option (``args.data.shuffle`` once OpenRLHF's ``hierarchize`` nests it), added next to this one.
FLAG = "--data.shuffle"
ANCHOR = "--data.prompt_dataset"
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"
ASYNC_TRAINER_MODULE = "openrlhf.trainer.ppo_trainer_async"
FUNCTION = "prepare_datasets"
_MARK = "_gem_rows_in_order"  # on a replacement: it wraps OpenRLHF's function (its __wrapped__)
_VALUES = {"true": True, "false": False}


def parse_shuffle(text: str) -> bool:
    """The option's value: ``true`` or ``false`` (any case). Anything else is a :class:`CliError`, which argparse does
    not catch: the launcher prints it as one line (exit 2) instead of OpenRLHF's whole usage."""
    value = _VALUES.get(str(text).strip().lower())
    if value is None:
        raise CliError(f"{FLAG} must be true or false, got {text!r}")
    return value


def shuffles(args: Any) -> bool:
    """Whether the prompt rows are shuffled: OpenRLHF's way unless ``args.data.shuffle`` is false (absent: a run the
    launcher did not parse, OpenRLHF's way)."""
    value = getattr(getattr(args, "data", None), "shuffle", True)
    if not isinstance(value, bool):
        raise ValueError(f"args.data.shuffle must be True or False, got {value!r}")
    return value


def in_order(strategy: Any, loader: Any) -> Any:
    """``loader`` rebuilt by ``strategy.setup_dataloader`` with ``shuffle=False`` and everything else as it was."""
    return strategy.setup_dataloader(
        loader.dataset,
        loader.batch_size,
        pin_memory=loader.pin_memory,
        shuffle=False,
        collate_fn=loader.collate_fn,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
    )


def make_prepare_datasets(original: Callable[..., Any]) -> Callable[..., Any]:
    """``prepare_datasets`` that keeps the prompt rows in order when ``args.data.shuffle`` is false."""
    while getattr(original, _MARK, False):  # a module that imported an already patched name
        original = original.__wrapped__

    @functools.wraps(original)
    def prepare_datasets(strategy: Any, tokenizer: Any) -> Any:
        prompts_dataloader, eval_dataloader, max_steps = original(strategy, tokenizer)
        if shuffles(strategy.args):
            return prompts_dataloader, eval_dataloader, max_steps
        return in_order(strategy, prompts_dataloader), eval_dataloader, max_steps

    setattr(prepare_datasets, _MARK, True)
    return prepare_datasets
