"""Dataset-backed envs: rows from Hugging Face ``datasets``, from the hub or from local files.

Every task env (math, code, QA, logic, the evaluation sets) reads its questions through
:func:`load_split` and walks them with :class:`DatasetEnv`:

* **where the rows come from**, first match wins: ``data_files=`` (a path, a list of paths or a
  ``{split: path}`` mapping; ``.jsonl``/``.json``/``.parquet``/``.csv``); then a local copy under
  ``$GEM_DATA_DIR/<owner>__<name>/<split>.<ext>`` (for machines without internet); then the hub dataset
  the id names (GEM's own dataset names, so that ``make("math:Math12K")`` just works online). Offline
  (``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` set, or the hub unreachable within a few seconds), a dataset
  that is not in the local cache is one :class:`DatasetUnavailableError` naming the id and the
  ``data_files=`` way; the hub is never waited on for long.
* **which row an episode asks**: ``reset(options={"idx": i})`` asks row ``i`` (evaluation). Otherwise
  episodes walk a stream of positions: ``reset(seed=s)`` goes to position ``s``, ``reset()`` to the one
  after the last. Position ``p`` is row ``perm_e[p % n]`` of epoch ``e = p // n``, where ``perm_e`` is a
  permutation seeded by ``(seed, e)`` (``shuffle=True``, training: every epoch in a new order, the same
  on every machine) or the identity (``shuffle=False``, the ``eval:*`` sets: the split in order).

Loaded splits are cached per process: a thousand envs of one id share one table.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import numpy as np

from gem_core.core import Env
from gem_core.errors import GemError, InvalidArgumentError, ResetNeeded
from gem_core.params import Param, invalid
from gem_core.parsing import echo

DATA_DIR_VAR = "GEM_DATA_DIR"
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
#: Seconds the hub may take to accept a connection before it counts as unreachable.
HUB_PROBE_TIMEOUT_S = 3.0


class DatasetUnavailableError(GemError, RuntimeError):
    """An env's dataset cannot be had here: not given as files, not cached, and the hub out of reach."""


class FilesParam(Param):
    """``data_files``: a path, a non-empty list of paths, or a ``{split: path(s)}`` mapping; or None."""

    def allowed(self) -> str:
        return "a file path (.jsonl, .json, .parquet, .csv), a list of them or a {split: path} mapping, or None (the hub dataset)"

    def check(self, name: str, value: Any, where: str = "") -> Any:
        ok = (
            value is None
            or _is_paths(value)
            or (isinstance(value, Mapping) and bool(value) and all(isinstance(k, str) and _is_paths(v) for k, v in value.items()))
        )
        if not ok:
            raise invalid(name, value, self.allowed(), where, wrong_type=True)
        return value


def _is_paths(value: Any) -> bool:
    if isinstance(value, (str, os.PathLike)):
        return bool(str(value))
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, (str, os.PathLike)) and str(v) for v in value)


# -- loading ---------------------------------------------------------------------------------------

_cache: dict[tuple[Any, ...], Any] = {}


def _arithmetic_rows() -> list[dict[str, Any]]:
    from gem_core.envs.math_data import generate_math_rows

    return generate_math_rows(4000, seed=0)


#: Datasets gem_core generates itself (no hub, no files): name -> rows.
GENERATED: dict[str, Any] = {"gem-core/arithmetic": _arithmetic_rows}
_cache_lock = threading.Lock()
_hub_reachable: bool | None = None


def hub_reachable() -> bool:
    """Whether the Hugging Face hub can be reached: False when an offline variable is set; True behind an
    HTTP(S) proxy; else a TCP connection to ``HF_ENDPOINT`` within :data:`HUB_PROBE_TIMEOUT_S` (checked once
    per process)."""
    global _hub_reachable
    if any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on") for var in _OFFLINE_VARS):
        return False
    if _hub_reachable is None and any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        _hub_reachable = True  # behind a proxy a direct connection says nothing: let datasets (and its timeouts) try
    if _hub_reachable is None:
        endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
        try:
            with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
                _hub_reachable = True
        except OSError:
            _hub_reachable = False
    return _hub_reachable


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetUnavailableError("dataset envs need Hugging Face `datasets`: pip install -e '.[tasks]'") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _local_copy(dataset_name: str, split: str) -> Path | None:
    root = os.environ.get(DATA_DIR_VAR)
    if not root:
        return None
    folder = Path(root) / dataset_name.replace("/", "__")
    for ext in _FORMATS:
        path = folder / f"{split}{ext}"
        if path.is_file():
            return path
    return None


def _format_of(env_id: str, files: Any) -> str:
    first = files
    while isinstance(first, (list, tuple)):
        first = first[0]
    if isinstance(first, Mapping):
        first = next(iter(first.values()))
        while isinstance(first, (list, tuple)):
            first = first[0]
    suffix = Path(str(first)).suffix.lower()
    if suffix not in _FORMATS:
        raise invalid("data_files", files, f"files ending in {', '.join(_FORMATS)}", env_id)
    return _FORMATS[suffix]


def _files_exist(env_id: str, files: Any) -> None:
    paths = list(files.values()) if isinstance(files, Mapping) else [files]
    flat: list[str] = []
    for p in paths:
        flat.extend(map(str, p) if isinstance(p, (list, tuple)) else [str(p)])
    missing = [p for p in flat if not any(ch in p for ch in "*?[") and not Path(p).is_file()]
    if missing:
        raise invalid("data_files", files, f"files that exist ({missing[0]!r} does not)", env_id)


def load_split(env_id: str, dataset_name: str | None, split: str, data_files: Any = None) -> Any:
    """The ``datasets.Dataset`` of one split, from ``data_files``, ``$GEM_DATA_DIR`` or the hub (see the
    module docstring); cached per process."""
    key = (dataset_name, split, _freeze(data_files), os.environ.get(DATA_DIR_VAR))
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    if data_files is not None:
        table = _load_files(env_id, data_files, split)
    elif dataset_name in GENERATED:
        table = _import_datasets().Dataset.from_list(GENERATED[dataset_name]())
    else:
        local = _local_copy(dataset_name, split) if dataset_name else None
        if local is not None:
            table = _load_files(env_id, str(local), split)
        else:
            table = _load_hub(env_id, dataset_name, split)
    with _cache_lock:
        _cache[key] = table
    return table


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(map(_freeze, value))
    return None if value is None else str(value)


def _load_files(env_id: str, data_files: Any, split: str) -> Any:
    _files_exist(env_id, data_files)
    builder = _format_of(env_id, data_files)
    datasets = _import_datasets()
    if isinstance(data_files, Mapping):
        if split not in data_files:
            raise invalid("split", split, f"one of the splits given in data_files: {', '.join(map(repr, data_files))}", env_id)
        files = {split: _plain_paths(data_files[split])}
    else:
        files = {"train": _plain_paths(data_files)}
        split = "train"
    try:
        return datasets.load_dataset(builder, data_files=files, split=split)
    except Exception as exc:  # a malformed file: say which, in one line
        raise InvalidArgumentError(
            f"{env_id}: data_files={echo(data_files)} could not be read as {builder}: {type(exc).__name__}: {str(exc)[:300]}",
            name="data_files",
            value=data_files,
            allowed="readable files",
        ) from None


def _plain_paths(value: Any) -> Any:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)


def _unavailable(env_id: str, dataset_name: str | None, split: str, why: str) -> DatasetUnavailableError:
    name = f"the hub dataset {dataset_name!r} (split {split!r})" if dataset_name else "no hub dataset"
    return DatasetUnavailableError(
        f"{env_id}: {name} is not available here ({why}). Give the rows as local files: "
        f"make({env_id!r}, data_files='rows.jsonl') (.jsonl/.json/.parquet/.csv; question_key= and "
        f"answer_key= name the fields), or put a copy at ${DATA_DIR_VAR}/"
        f"{(dataset_name or 'owner/name').replace('/', '__')}/{split}.jsonl"
    )


def _load_hub(env_id: str, dataset_name: str | None, split: str) -> Any:
    if not dataset_name:
        raise _unavailable(env_id, dataset_name, split, "this env has none; pass data_files")
    online = hub_reachable()
    datasets = _import_datasets()
    previous = datasets.config.HF_HUB_OFFLINE
    if not online:
        datasets.config.HF_HUB_OFFLINE = True  # only the local cache: no network call can hang
    try:
        return datasets.load_dataset(dataset_name, split=split)
    except Exception as exc:
        why = "offline, and not in the local Hugging Face cache" if not online else f"{type(exc).__name__}: {str(exc)[:200]}"
        raise _unavailable(env_id, dataset_name, split, why) from None
    finally:
        datasets.config.HF_HUB_OFFLINE = previous


# -- the env ---------------------------------------------------------------------------------------

_TEXT = Param(str)
_SEED = Param(int, low=0, high=2**63 - 1)


class DatasetEnv(Env):
    """A single-turn env over the rows of a dataset split; subclasses grade the answer (:meth:`grade`).

    ``question_key``/``answer_key``: the row's fields. ``seed``: the shuffling seed (epochs are
    permutations seeded by ``(seed, epoch)``); ``shuffle=False`` keeps the split's order.
    """

    params: ClassVar[dict[str, Param]] = {
        "dataset_name": Param(str, none="no hub dataset: data_files= is needed"),
        "split": _TEXT,
        "data_files": FilesParam(str, none="the hub dataset, or a copy under $GEM_DATA_DIR"),
        "question_key": _TEXT,
        "answer_key": _TEXT,
        "seed": _SEED,
        "shuffle": Param(bool),
    }
    #: The constructor argument that names the answer field (``test_key`` for code).
    _answer_param: ClassVar[str] = "answer_key"
    #: The line after the question that says how to answer (GEM's prompt for the category).
    instruction: ClassVar[str] = ""
    max_turns = 1
    #: The reset message is a dataset item's question: its length is the data's (the property tests know).
    prompt_from_data: ClassVar[bool] = True

    def __init__(
        self,
        dataset_name: str | None = None,
        split: str = "train",
        data_files: Any = None,
        question_key: str = "problem",
        answer_key: str = "answer",
        seed: int = 0,
        shuffle: bool = True,
    ):
        from gem_core.registry import building_id

        self.env_id = building_id() or type(self).__name__
        self._setup(load_split(self.env_id, dataset_name, split, data_files), question_key, answer_key, seed, shuffle, data_files, split)

    def _setup(self, table: Any, question_key: str, answer_key: str, seed: int, shuffle: bool, data_files: Any = None, split: str = "") -> None:
        """Walk ``table`` (a ``datasets.Dataset``, or any sequence of row dicts with ``column_names``)."""
        env_id = self.env_id
        self.data = table
        columns = list(self.data.column_names)
        for name, key in (("question_key", question_key), (self._answer_param, answer_key)):
            if key not in columns:
                raise invalid(name, key, f"a field of the rows: {', '.join(map(repr, columns[:20]))}", env_id)
        if len(self.data) == 0:
            raise invalid("data_files" if data_files is not None else "split", data_files or split, "a split with at least one row", env_id)
        self.question_key, self.answer_key = question_key, answer_key
        self.shuffle_seed, self.shuffle = int(seed), bool(shuffle)
        self._perm: tuple[int, np.ndarray] | None = None
        self._next = 0
        self.row: dict[str, Any] | None = None
        self.item: int | None = None
        self.done = True

    # -- which row
    def _row_at(self, position: int) -> int:
        n = len(self.data)
        epoch, offset = divmod(position, n)
        if not self.shuffle:
            return offset
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([self.shuffle_seed, epoch]))
            self._perm = (epoch, rng.permutation(n))
        return int(self._perm[1][offset])

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        idx = (options or {}).get("idx") if isinstance(options, Mapping) else None
        if idx is not None:
            Param(int, low=0, high=len(self.data) - 1).check("idx", idx, f"{self.env_id}: reset options")
            item = int(idx)
        else:
            position = int(seed) if seed is not None else self._next
            self._next = position + 1
            item = self._row_at(position)
        self.item = item
        self.row = dict(self.data[item])
        self.done = False
        question = str(self.row[self.question_key])
        observation = question + ("\n\n" + self.instruction if self.instruction else "")
        return observation, {"idx": item}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done or self.row is None:
            raise ResetNeeded(f"{self.env_id}: step() before reset() or after the episode ended; call reset()")
        self.done = True
        reward, info, observation = self.grade(action, self.row)
        info.setdefault("idx", self.item)
        return observation, float(reward), True, False, info

    def grade(self, action: Any, row: dict[str, Any]) -> tuple[float, dict[str, Any], str]:
        """``(reward, info, observation)`` for the answer ``action`` to ``row``; info has ``format_error``."""
        raise NotImplementedError

    def answer(self) -> Any:
        """The current row's gold answer (tests and oracles)."""
        return None if self.row is None else self.row[self.answer_key]

    # -- state: the shared table is not copied
    _SHARED: ClassVar[frozenset[str]] = frozenset({"data", "spec", "_perm"})
    #: Per-instance resources (a sandbox handle): neither in the state nor shared with a clone.
    _LOCAL: ClassVar[frozenset[str]] = frozenset()

    def get_state(self) -> Any:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in self._SHARED | self._LOCAL})

    def set_state(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state))
        self._perm = None

    def clone(self) -> Env:
        new = copy.copy(self)
        new.__dict__ = {k: v for k, v in self.__dict__.items() if k in self._SHARED}
        new.set_state(self.get_state())
        return new


class EvalSetMixin:
    """An evaluation set: ``len()`` is its number of items (``gem-core eval`` plays each once)."""

    def __len__(self) -> int:
        return len(self.data)  # type: ignore[attr-defined]
