"""The results file of ``gem-core eval``: one JSON line per episode, written whole and flushed.

A line is written with one ``write`` on a file opened for appending, so a run that is killed leaves
whole lines behind (at worst a last line cut short by a full disk, which :func:`read_results` drops
and :meth:`ResultsFile.open` cuts off). ``--resume`` reads the file back, skips the episodes it holds
and appends the rest; an episode that ended with a model error is played again and its new line
replaces the old one. When a run completes, the file is rewritten in plan order, one line per
episode, so an interrupted and resumed run ends with the same file as an uninterrupted one (apart
from :data:`TIMING_FIELDS`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gem_core.eval.plan import EpisodeKey, EvalJob

TIMING_FIELDS = ("seconds",)  # differ between two runs of the same episodes


class ResultsError(ValueError):
    """A results file that cannot be used (not ours, another run's, unreadable)."""


@dataclass
class EpisodeResult:
    """What one episode did, as one line of the results file.

    ``success``: the env's ``info["success"]`` on the last turn. ``return_`` (``"return"`` in the file):
    the sum of the rewards. ``turns``: model responses the env received. ``tool_calls``: turns that
    were tool calls. ``tokens_in``/``tokens_out``: prompt and response tokens over every request
    (a local model: counted; an endpoint: its ``usage``; ``None`` when unknown, e.g. baselines).
    ``terminated``: the env ended the episode. ``truncation_reason``: why it was cut otherwise
    (``max_turns``, ``context_limit``, ``abort``...). ``finish_reason``: how the last response ended
    (``stop``/``length``/``abort``). ``error``: why the episode could not be played to its end (a
    model request that failed after its retries, an env that raised), else ``None``. ``seconds``:
    wall time. ``transcript``: with ``--save-transcripts``, the first message and every turn.
    """

    env_id: str
    seed: int | None
    item: int | None
    episode: int
    model: str
    success: bool
    return_: float
    turns: int
    tool_calls: int
    tokens_in: int | None
    tokens_out: int | None
    terminated: bool
    truncation_reason: str | None
    finish_reason: str | None
    error: str | None
    seconds: float
    transcript: dict[str, Any] | None = None

    @property
    def key(self) -> EpisodeKey:
        return (self.env_id, self.seed, self.item)

    def to_json(self) -> str:
        data = {("return" if k == "return_" else k): v for k, v in dataclasses.asdict(self).items()}
        if data["transcript"] is None:
            del data["transcript"]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeResult:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {("return_" if k == "return" else k): v for k, v in data.items()}
        missing = sorted(fields - set(data) - {"transcript"})
        if missing:
            raise ResultsError(f"a line lacks the field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k in fields})


def read_results(path: str | os.PathLike[str]) -> tuple[list[EpisodeResult], int]:
    """The results in a file, the last line per episode (a replayed episode replaces its earlier
    line), in file order; and the byte offset after the last whole line (a cut-off tail is ignored).
    A line in the middle that is not a result raises :class:`ResultsError` naming the line."""
    with open(path, "rb") as handle:
        data = handle.read()
    end = data.rfind(b"\n") + 1  # a last line without its newline was cut short
    by_key: dict[EpisodeKey, EpisodeResult] = {}
    for number, raw in enumerate(data[:end].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            result = EpisodeResult.from_dict(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ResultsError(f"{os.fspath(path)}, line {number}: not a gem-core eval result ({exc})") from None
        by_key.pop(result.key, None)
        by_key[result.key] = result
    return list(by_key.values()), end


class ResultsFile:
    """The output file of a run: :meth:`open` (fresh or resumed), :meth:`append` per episode,
    :meth:`finish` to rewrite it in plan order once every episode is in."""

    def __init__(self, path: str | os.PathLike[str], done: dict[EpisodeKey, EpisodeResult], fd: int):
        self.path = os.fspath(path)
        self.done = done
        self._fd = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, resume: bool, overwrite: bool = False) -> ResultsFile:
        """Open for appending. An existing file needs ``resume`` (its episodes are kept: ``done``;
        a cut-off last line is removed) or ``overwrite`` (it is emptied)."""
        path = os.fspath(path)
        done: dict[EpisodeKey, EpisodeResult] = {}
        if os.path.exists(path) and not overwrite:
            if not resume:
                raise ResultsError(f"{path} already exists: --resume continues it, --overwrite replaces it")
            results, end = read_results(path)
            if end != os.path.getsize(path):
                os.truncate(path, end)
            done = {r.key: r for r in results}
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if overwrite else 0)
        return cls(path, done, os.open(path, flags, 0o644))

    def append(self, result: EpisodeResult) -> None:
        """Write one whole line (one ``write`` call, looped only if the OS takes part of it)."""
        data = (result.to_json() + "\n").encode()
        while data:
            data = data[os.write(self._fd, data) :]
        self.done[result.key] = result

    def finish(self, jobs: Sequence[EvalJob]) -> list[EpisodeResult]:
        """Rewrite the file as exactly one line per planned episode, in plan order (atomically: a
        temporary file renamed over it); returns those results."""
        ordered = [self.done[job.key] for job in jobs if job.key in self.done]
        temporary = f"{self.path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.writelines(result.to_json() + "\n" for result in ordered)
            handle.flush()
            os.fsync(handle.fileno())
        self.close()
        os.replace(temporary, self.path)
        return ordered

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def check_resumable(done: Iterable[EpisodeResult], jobs: Sequence[EvalJob], model: str, path: str) -> None:
    """Refuse to resume a file written by another model, or holding episodes this plan does not play."""
    planned = {job.key for job in jobs}
    for result in done:
        if result.model != model:
            raise ResultsError(f"{path} holds results of {result.model!r}, not {model!r}: write this run to another --out")
        if result.key not in planned:
            env_id, seed, item = result.key
            where = f"item {item}" if item is not None else f"seed {seed}"
            raise ResultsError(
                f"{path} holds an episode this run would not play ({env_id}, {where}): resume with the same env ids, "
                "--seed-start and at least as many --episodes, or write to another --out"
            )
