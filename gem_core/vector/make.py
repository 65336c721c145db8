"""``make_vec``: a vector env of registered ids, in the mode asked for, every argument checked first.

The ``sync`` and ``async`` modes live in this package; the ``ray`` mode lives with the rest of the Ray
backend in :mod:`gem_core.ray` (above this layer), so it is named by its entry point and imported only
when a Ray vector env is made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from gem_core.core import Env
from gem_core.errors import UnknownKwargError, suggest
from gem_core.params import Param, check_args, invalid
from gem_core.registry import EnvFactory, accepted_kwargs, check_kwargs, spec
from gem_core.vector.async_vector_env import AsyncVectorEnv
from gem_core.vector.sync_vector_env import SyncVectorEnv
from gem_core.vector.vector_env import VectorEnv

#: The vectorization modes: a class, or the ``"module:Class"`` entry point of one that is imported when used.
VECTOR_MODES: dict[str, type[VectorEnv] | str] = {
    "sync": SyncVectorEnv,
    "async": AsyncVectorEnv,
    "ray": "gem_core.ray.vector_env:RayVectorEnv",
}


def vector_class_of(mode: str) -> type[VectorEnv]:
    """The vector env class of ``mode`` (imported here when it is named by an entry point)."""
    entry = VECTOR_MODES[mode]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
    return entry


def make_vec(
    id: str | Sequence[str],
    num_envs: int | None = None,
    *,
    vectorization_mode: str = "sync",
    wrappers: Sequence[Callable[[Env], Env]] = (),
    vector_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> VectorEnv:
    """A vector env of ``num_envs`` copies of ``id`` (or one env per id when given a list).

    ``vectorization_mode`` is ``"sync"`` (one process), ``"async"`` (worker processes) or ``"ray"``
    (Ray actors on a cluster: ``pip install 'gem-core[ray]'``); ``vector_kwargs`` go to the vector env
    (``autoreset_mode``, ``num_workers``, ``step_timeout``, ``envs_per_actor``, ``num_cpus``...).
    Every argument, the env kwargs included, is checked here in the caller, the same way for every
    mode, before any env, worker or actor is built (:class:`~gem_core.errors.InvalidArgumentError`).
    """
    _VECTOR_MODE.check("vectorization_mode", vectorization_mode, "make_vec")
    if isinstance(id, str):
        if num_envs is None:
            num_envs = 1
        _NUM_ENVS.check("num_envs", num_envs, "make_vec")
        ids = [id] * int(num_envs)
    else:
        ids = list(id)
        if num_envs is not None and num_envs != len(ids):
            raise invalid("num_envs", num_envs, f"None or the number of ids given ({len(ids)})", "make_vec")
    if not ids:
        raise invalid("id", id, "an env id or a non-empty list of env ids", "make_vec")
    specs = {env_id: spec(env_id) for env_id in dict.fromkeys(ids)}  # unknown ids fail here, in the caller
    for env_spec in specs.values():
        check_kwargs(env_spec, kwargs)  # bad kwargs too: one message whichever the mode
    vector_class = vector_class_of(vectorization_mode)
    vector_kwargs = dict(vector_kwargs or {})
    _check_vector_kwargs(vector_class, vector_kwargs, vectorization_mode)
    vector_class.check_backend()  # e.g. Ray missing: one clear error naming the extra, before anything is built
    fns = [EnvFactory(specs[env_id], tuple(wrappers), kwargs) for env_id in ids]
    return vector_class(fns, **vector_kwargs)


_VECTOR_MODE = Param(str, choices=tuple(VECTOR_MODES))
#: The most envs one vector env holds (a bound, so that a typo fails with a message, not a MemoryError).
MAX_NUM_ENVS = 1_000_000
_NUM_ENVS = Param(int, low=1, high=MAX_NUM_ENVS)


def _check_vector_kwargs(vector_class: type, vector_kwargs: dict[str, Any], mode: str) -> None:
    """``vector_kwargs`` against the vector class's constructor: known names, declared types and ranges."""
    where = f"make_vec(vectorization_mode={mode!r})"
    allowed = (accepted_kwargs(vector_class) or set()) - {"env_fns"}
    unknown = sorted(set(vector_kwargs) - allowed)
    if unknown:
        hints = "".join(suggest(k, allowed) for k in unknown)
        raise UnknownKwargError(
            f"{where}: vector_kwargs has {', '.join(map(repr, unknown))}, which {vector_class.__name__} does not take.{hints} "
            f"It accepts: {', '.join(sorted(allowed))}.",
            name=unknown[0],
            value=vector_kwargs[unknown[0]],
            allowed=", ".join(sorted(allowed)),
        )
    check_args(vector_class, vector_kwargs, where)
