"""ShardedVectorEnv: envs split into contiguous shards, each hosted elsewhere (a worker process, a Ray actor).

What every out-of-process backend shares, written once: the shard layout, the request a host serves
(:func:`serve_request`: one pickled message in, one pickled reply out, for a whole shard), and the
parent's side of it (ops grouped per shard, replies mapped back to env indices, a lost host's envs
reported as rebuilt). A backend only says how a message reaches a host and how a dead or late host is
replaced (:meth:`ShardedVectorEnv._exchange`, :meth:`ShardedVectorEnv._restart_shard`).
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any

from gem_core.vector.vector_env import CRASH, ERROR, OK, AutoresetMode, VectorEnv, VectorEnvError, call_env, run_op

PICKLE_PROTOCOL = 5


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)


def contiguous_shards(num_envs: int, num_shards: int) -> list[list[int]]:
    """``num_envs`` indices in ``num_shards`` contiguous runs whose sizes differ by at most one."""
    base, extra = divmod(num_envs, num_shards)
    shards, start = [], 0
    for s in range(num_shards):
        size = base + (1 if s < extra else 0)
        shards.append(list(range(start, start + size)))
        start += size
    return shards


# ------------------------------------------------------------------------------------------------
# The host side.
# ------------------------------------------------------------------------------------------------


def _portable(result: tuple) -> tuple:
    """A result without the exception object (it may not pickle; the traceback text carries it)."""
    return result if result[0] != ERROR else (ERROR, result[1], result[2], None)


def _encode_reply(results: list[tuple]) -> bytes:
    """Pickle a reply; a result that does not pickle becomes an ``ERROR`` result instead of a crash."""
    try:
        return dumps(("ok", results))
    except Exception:
        safe = []
        for result in results:
            try:
                dumps(result)
                safe.append(result)
            except Exception as exc:
                safe.append((ERROR, f"the env's result could not be pickled: {type(exc).__name__}: {exc}", traceback.format_exc(), None))
        return dumps(("ok", safe))


def serve_request(envs: dict[int, Any], env_indices: list[int], message: bytes) -> bytes:
    """The reply to one request on a shard's envs: ``("ops", [(index, op), ...])`` runs the ops,
    ``("call", name, args, kwargs, invoke)`` calls every env of the shard. Never raises: a request
    that cannot be served gets ``("fatal", traceback_text)``."""
    try:
        request = pickle.loads(message)
        command = request[0]
        if command == "ops":
            results = [_portable(run_op(envs[i], op)) for i, op in request[1]]
        elif command == "call":
            _, name, args, kwargs, invoke = request
            results = [_portable(call_env(envs[i], name, args, kwargs, invoke)) for i in env_indices]
        else:
            raise ValueError(f"unknown worker command {command!r}")
        return _encode_reply(results)
    except Exception:
        return dumps(("fatal", traceback.format_exc()))


def build_envs(env_fns: list[Any], env_indices: list[int]) -> tuple[dict[int, Any], str | None]:
    """A shard's envs, or ``({}, traceback_text)`` when one could not be built (the built ones closed)."""
    envs: dict[int, Any] = {}
    try:
        for i, fn in zip(env_indices, env_fns):
            envs[i] = fn()
    except BaseException:
        error = traceback.format_exc()
        close_envs(envs)
        return {}, error
    return envs, None


def close_envs(envs: dict[int, Any]) -> None:
    for env in envs.values():
        try:
            env.close()
        except Exception:  # one env failing to close must not keep the others open
            pass


# ------------------------------------------------------------------------------------------------
# The parent side.
# ------------------------------------------------------------------------------------------------


class ShardedVectorEnv(VectorEnv):
    """A :class:`VectorEnv` whose envs live in shards on hosts that a backend manages."""

    def __init__(self, num_envs: int, num_shards: int, autoreset_mode: AutoresetMode | str, on_error: str):
        super().__init__(num_envs, autoreset_mode, on_error)
        self._shard_envs = contiguous_shards(self.num_envs, min(num_shards, self.num_envs))
        self._shard_of = [s for s, indices in enumerate(self._shard_envs) for _ in indices]

    @property
    def shards(self) -> list[list[int]]:
        """The env indices each host holds: ``shards[s]`` for host ``s``."""
        return [list(indices) for indices in self._shard_envs]

    # -- what backends implement -------------------------------------------------------------------
    def _exchange(self, messages: dict[int, bytes], what: str) -> tuple[dict[int, tuple], dict[int, str]]:
        """Send ``messages[s]`` to host ``s``; return ``(replies, failures)``: the unpickled reply of each
        host that answered, and why each other one did not (it died or overran its time)."""
        raise NotImplementedError

    def _restart_shard(self, shard: int) -> None:
        """Replace host ``shard`` (dead or late) by a fresh one with fresh envs."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------------
    def _request(self, messages: dict[int, bytes], what: str) -> tuple[dict[int, tuple], dict[int, str]]:
        """:meth:`_exchange`, then hosts that failed are restarted, and a reply that is an error (a shard
        that could not rebuild its envs, a request it could not serve) raises, after all were read."""
        replies, failures = self._exchange(messages, what)
        fatal = None
        for s, reply in list(replies.items()):
            if reply[0] != "ok":  # "init_error" or "fatal": nothing to hand back, but read everything first
                del replies[s]
                problem = "could not rebuild its envs after a restart" if reply[0] == "init_error" else f"could not serve {what}"
                fatal = fatal or VectorEnvError(f"{self._host_name(s)} {problem}:\n{reply[1]}", remote_traceback=reply[1])
        for s in failures:
            self._restart_shard(s)
        if fatal is not None:
            raise fatal
        return replies, failures

    def _host_name(self, shard: int) -> str:
        return f"worker {shard}"

    def _execute(self, ops: dict[int, tuple], what: str) -> dict[int, tuple]:
        self._check_open()
        grouped: dict[int, list[tuple[int, tuple]]] = {}
        for i, op in ops.items():
            grouped.setdefault(self._shard_of[i], []).append((i, op))
        replies, failures = self._request({s: dumps(("ops", items)) for s, items in grouped.items()}, what)
        results: dict[int, tuple] = {}
        for s, items in grouped.items():
            if s in failures:
                for i, _ in items:
                    results[i] = (CRASH, failures[s])
            else:
                for (i, _), result in zip(items, replies[s][1]):
                    results[i] = result
        for s, reason in failures.items():
            self._envs_rebuilt(self._shard_envs[s], reason, in_flight=ops)
        return results

    def _call(self, name: str, args: tuple, kwargs: dict, invoke: bool) -> list[tuple]:
        self._check_open()
        what = f"call({name!r})" if invoke else f"get_attr({name!r})"
        payload = dumps(("call", name, args, kwargs, invoke))
        replies, failures = self._request({s: payload for s in range(len(self._shard_envs))}, what)
        for s, reason in failures.items():
            self._envs_rebuilt(self._shard_envs[s], reason, in_flight=())
        if failures:
            reason = next(iter(failures.values()))
            raise VectorEnvError(f"{reason} during {what}; its envs were rebuilt and their episodes lost")
        results: list[tuple] = [(OK, None)] * self.num_envs
        for s, indices in enumerate(self._shard_envs):
            for i, result in zip(indices, replies[s][1]):
                results[i] = result
        return results
