"""RL2's training rows in the dataset's order, where the config asks for it (``+train_data.shuffle=false``).

rl-square 0.0.2 builds its training loader with ``shuffle=True`` and no switch (``RL2.datasets.get_dataloader``,
which ``PPOTrainer.get_dataloader`` calls). An experiment's rows are already the run's start states in the order
every trainer plays them (:func:`gem_core.experiment.update_start_seeds`), so the experiment's overrides add
``train_data.shuffle=false``, and this replacement of ``PPOTrainer.get_dataloader`` then rebuilds the training
loader RL2 made from the same dataset, batch size, ``drop_last`` and collate function, unshuffled. Without the key,
or with ``true``, RL2's own loader is returned as RL2 made it; the test loader is never touched. RL2 HEAD (read
from its source, not installable here) has no ``PPOTrainer.get_dataloader``: its rollout worker loads the rows, and
the patch (optional) has nothing to replace there, so HEAD keeps its own order.
"""

from __future__ import annotations

from typing import Any, Callable

#: The key of RL2's ``train_data`` config that asks for the rows in order (not in RL2's own config: ``+`` adds it).
SHUFFLE_KEY = "shuffle"


def shuffles(train_data: Any) -> bool:
    """Whether the training rows are shuffled: RL2's way unless ``train_data.shuffle`` is false (a value that is not
    true or false is one clear error)."""
    value = train_data.get(SHUFFLE_KEY, True) if hasattr(train_data, "get") else True
    if not isinstance(value, bool):
        raise ValueError(f"train_data.{SHUFFLE_KEY} must be true or false, got {value!r}")
    return value


def make_get_dataloader(original: Callable[..., Any]) -> Callable[..., Any]:
    """``PPOTrainer.get_dataloader`` that keeps the training rows in order when ``train_data.shuffle`` is false."""

    def get_dataloader(self: Any, train: bool) -> Any:
        loader = original(self, train)
        if not train or shuffles(self.config.train_data):
            return loader
        return type(loader)(loader.dataset, loader.batch_size, shuffle=False, drop_last=loader.drop_last, collate_fn=loader.collate_fn)

    return get_dataloader
