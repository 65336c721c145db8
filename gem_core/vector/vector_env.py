"""VectorEnv: the shared logic of the sync and async vector envs.

A vector env runs ``num_envs`` envs side by side. Everything that decides *what* happens to each env
(autoreset, subset stepping, reset masks, error policy, bookkeeping) lives here, once. Subclasses only
decide *where* the envs run: :class:`~gem_core.vector.SyncVectorEnv` in this process,
:class:`~gem_core.vector.AsyncVectorEnv` in worker processes.

The split is "parent decides, env side executes": for every call the parent turns the user's request
into one small *op* per env (``reset``, ``step``, or ``step`` followed by a same-step reset) and the env
side runs them with :func:`run_op`. The env side keeps no policy state, so a worker that is restarted
needs nothing but fresh envs.

Per-env status, kept in the parent:

* ``UNRESET``: never reset (or its reset failed); stepping it is an error.
* ``LIVE``: in an episode.
* ``ENDED``: its episode ended (or failed); the next step resets it (``NEXT_STEP``), or the user must
  reset it with a ``reset_mask`` (``DISABLED``).
* ``LOST``: its worker died while it was in an episode it was not stepping; its next step reports the
  lost episode as truncated, then it is ``ENDED``.
"""

from __future__ import annotations

import enum
import operator
import traceback
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from gem_core.errors import INFRA_ERROR, GemError, ResetNeeded
from gem_core.params import Param, check_args, invalid

__all__ = ["AutoresetMode", "VectorEnv", "VectorEnvError", "call_env", "run_op"]


class AutoresetMode(str, enum.Enum):
    """When a vector env resets an env whose episode ended (Gymnasium 1.x's three modes).

    * ``NEXT_STEP`` (default): the *next* step of that env resets it; that step's action is ignored and
      it returns the reset observation, reward 0, ``terminated = truncated = False`` and the reset info
      with ``info["autoreset"] = True``.
    * ``SAME_STEP``: the ending step resets it at once; the returned obs is the reset obs, and the
      terminal obs and info are in ``info["final_obs"]`` and ``info["final_info"]`` (the rest of the
      info is the reset info).
    * ``DISABLED``: never; stepping an ended env raises, reset it with ``reset(options={"reset_mask": m})``.
    """

    NEXT_STEP = "next_step"
    SAME_STEP = "same_step"
    DISABLED = "disabled"

    @classmethod
    def coerce(cls, value: AutoresetMode | str) -> AutoresetMode:
        """The mode named by ``value``: a member, or its name/value in any case ("NEXT_STEP", "NextStep")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.replace("_", "").replace("-", "").lower()
            for mode in cls:
                if mode.name.replace("_", "").lower() == key:
                    return mode
        names = ", ".join(mode.name for mode in cls)
        raise invalid("autoreset_mode", value, f"an AutoresetMode or one of {names}", wrong_type=not isinstance(value, str))


class VectorEnvError(GemError, RuntimeError):
    """An env inside a vector env raised (``on_error="raise"``), or a worker could not be (re)started.

    ``env_index`` names the env (``None`` when the failure is not one env's), and ``remote_traceback``
    holds the traceback text from where the env ran (a worker process for the async vector env).
    """

    def __init__(self, message: str, *, env_index: int | None = None, remote_traceback: str | None = None):
        super().__init__(message)
        self.env_index = env_index
        self.remote_traceback = remote_traceback


# ------------------------------------------------------------------------------------------------
# The env side: runs wherever the envs live (in this process, or in a worker). Written once.
# ------------------------------------------------------------------------------------------------

# Op kinds (the first item of an op tuple).
RESET = "reset"  # ("reset", seed, options)
STEP = "step"  # ("step", action)
STEP_THEN_RESET = "step_then_reset"  # ("step_then_reset", action): SAME_STEP autoreset

# Result kinds (the first item of a result tuple).
OK = "ok"  # ("ok", payload): payload is (obs, info) for a reset, the 5-tuple for a step
ERROR = "error"  # ("error", summary, traceback_text, exception_or_None): the env raised
CRASH = "crash"  # ("crash", reason): the env's worker died or timed out; the env was rebuilt


def run_op(env: Any, op: tuple) -> tuple:
    """Run one op on one env and return its result tuple; exceptions become ``ERROR`` results."""
    try:
        kind = op[0]
        if kind == STEP:
            return (OK, env.step(op[1]))
        if kind == STEP_THEN_RESET:
            obs, reward, terminated, truncated, info = env.step(op[1])
            if terminated or truncated:
                final_obs, final_info = obs, info
                obs, reset_info = env.reset(seed=None, options=None)
                info = {**reset_info, "final_obs": final_obs, "final_info": final_info}
            return (OK, (obs, reward, terminated, truncated, info))
        if kind == RESET:
            return (OK, env.reset(seed=op[1], options=op[2]))
        raise ValueError(f"unknown vector op {kind!r}")
    except Exception as exc:
        return (ERROR, f"{type(exc).__name__}: {exc}", traceback.format_exc(), exc)


def call_env(env: Any, name: str, args: tuple, kwargs: dict, invoke: bool) -> tuple:
    """``getattr(env, name)``, called with ``args``/``kwargs`` when ``invoke`` and callable; as a result tuple."""
    try:
        value = getattr(env, name)
        if invoke and callable(value):
            value = value(*args, **kwargs)
        return (OK, value)
    except Exception as exc:
        return (ERROR, f"{type(exc).__name__}: {exc}", traceback.format_exc(), exc)


# ------------------------------------------------------------------------------------------------
# The parent side.
# ------------------------------------------------------------------------------------------------

UNRESET, LIVE, ENDED, LOST = range(4)
_ON_ERROR = ("raise", "truncate")
_RESERVED_CALLS = frozenset({"reset", "step", "close"})


def derive_restart_seed(base_seed: int | None, restarts: int) -> int | None:
    """The seed for an env rebuilt after a crash: a function of its last seed and restart count, so a
    run that crashes at the same point replays identically. ``None`` when the env was never seeded."""
    if base_seed is None:
        return None
    return int(np.random.SeedSequence([abs(int(base_seed)), restarts]).generate_state(1)[0])


class VectorEnv:
    """Base class: ``num_envs`` envs behind one batched ``reset``/``step``.

    ``reset(seed, options) -> (obs: list, infos: list[dict])``; ``step(actions) -> (obs: list,
    rewards: float64 array, terminated: bool array, truncated: bool array, infos: list[dict])``.
    See :meth:`reset` and :meth:`step` for seeds, reset masks and subset stepping, and
    :class:`AutoresetMode` for what happens when an episode ends.

    ``on_error`` says what an exception raised inside an env's ``step``/autoreset does:
    ``"raise"`` (default) raises :class:`VectorEnvError` in the caller, with the env index and the
    traceback text, after every other env of that call has run (their transitions are lost to the
    caller; the failed env must be reset); ``"truncate"`` reports that env's episode as truncated,
    reward 0, its last observation, ``info["error"]`` (summary), ``info["traceback"]``,
    ``info["worker_restarted"] = False`` and ``info["infra_error"]`` (the summary: not the policy's fault), and resets it on its next step (under ``DISABLED``: reset it
    with a mask). Exceptions inside ``reset()``/``call()`` always raise: there is nothing to return.
    """

    #: The options every vector env takes, checked by its constructor and by make_vec (gem_core.params).
    params: ClassVar[dict[str, Param]] = {"on_error": Param(str, choices=_ON_ERROR)}

    @classmethod
    def check_backend(cls) -> None:
        """Raise one clear error when what this class runs on is not installed (``make_vec`` asks before
        it builds anything). The in-process and worker-process classes need nothing more."""

    def __init__(self, num_envs: int, autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, on_error: str = "raise"):
        if num_envs < 1:
            raise invalid("env_fns", num_envs, "at least one env", type(self).__name__)
        check_args(VectorEnv, {"on_error": on_error}, type(self).__name__)
        self.num_envs = int(num_envs)
        self.autoreset_mode = AutoresetMode.coerce(autoreset_mode)
        self.on_error = on_error
        self.closed = False
        self._status = [UNRESET] * self.num_envs
        self._last_obs: list[Any] = [None] * self.num_envs
        self._seed_base: list[int | None] = [None] * self.num_envs  # last integer seed given to reset
        self._restarts = [0] * self.num_envs
        self._restart_seed: list[int | None] = [None] * self.num_envs  # for the next reset of a rebuilt env
        self._lost_reason: list[str | None] = [None] * self.num_envs

    # -- what subclasses implement -----------------------------------------------------------------
    def _execute(self, ops: dict[int, tuple], what: str) -> dict[int, tuple]:
        """Run ``ops`` (env index -> op) and return env index -> result tuple (``OK``/``ERROR``/``CRASH``)."""
        raise NotImplementedError

    def _call(self, name: str, args: tuple, kwargs: dict, invoke: bool) -> list[tuple]:
        """``call_env`` on every env, in index order."""
        raise NotImplementedError

    def _close(self) -> None:
        """Release the envs (and workers)."""
        raise NotImplementedError

    # -- the API -------------------------------------------------------------------------------------
    def reset(self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[list[Any], list[dict[str, Any] | None]]:
        """Reset envs and return ``(obs, infos)``, one entry per env.

        ``seed``: an int gives env ``i`` the seed ``seed + i``; a list gives one seed (or ``None``) per
        env; ``None`` keeps each env's own RNG stream. ``options`` go to every env's ``reset``, except
        ``options["reset_mask"]``, a sequence of ``num_envs`` bools: only those envs are reset, and the
        entries of the others in the returned ``obs`` and ``infos`` are ``None`` (their episodes go on).
        """
        self._check_open()
        seeds = self._parse_seeds(seed)
        mask, env_options = self._parse_reset_options(options)
        indices = [i for i in range(self.num_envs) if mask[i]]

        def reset_ops(which: Iterable[int]) -> dict[int, tuple]:
            return {i: (RESET, seeds[i] if seeds[i] is not None else self._restart_seed[i], env_options) for i in which}

        results = self._execute(reset_ops(indices), "reset")
        crashed = [i for i in indices if results[i][0] == CRASH]
        if crashed:  # the worker was restarted with fresh envs: one more try, then give up
            results.update(self._execute(reset_ops(crashed), "reset"))
        obs: list[Any] = [None] * self.num_envs
        infos: list[dict[str, Any] | None] = [None] * self.num_envs
        failure: VectorEnvError | None = None
        for i in indices:
            result = results[i]
            if result[0] == OK:
                obs[i], infos[i] = result[1]
                self._status[i] = LIVE
                self._last_obs[i] = obs[i]
                if seeds[i] is not None:
                    self._seed_base[i] = seeds[i]
                self._restart_seed[i] = None
                self._lost_reason[i] = None
                continue
            self._status[i] = UNRESET
            if failure is None:
                if result[0] == CRASH:
                    failure = VectorEnvError(f"env {i}: reset failed twice, its worker was lost: {result[1]}", env_index=i)
                else:
                    failure = self._error_from(i, result, "reset")
        if failure is not None:
            raise failure
        return obs, infos

    def step(self, actions: Sequence[Any] | Mapping[int, Any]) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step envs and return ``(obs, rewards, terminated, truncated, infos)``.

        ``actions`` is either a sequence of ``num_envs`` actions, or a dict ``{env_index: action}`` that
        steps only those envs: then the five values cover only the stepped envs, in the dict's key
        order (``rewards[k]`` belongs to the ``k``-th key). Envs not named are left untouched.
        """
        self._check_open()
        indices, acts = self._parse_actions(actions)
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        step_kind = STEP_THEN_RESET if same_step else STEP
        for i in indices:  # validate everything before anything runs
            status = self._status[i]
            if status == UNRESET:
                raise ResetNeeded(f"env {i} has not been reset; call reset() before step()")
            if status == ENDED and self.autoreset_mode is AutoresetMode.DISABLED:
                raise ResetNeeded(
                    f"env {i}'s episode has ended and autoreset_mode is DISABLED; reset it with "
                    f"reset(options={{'reset_mask': mask}}) (mask[{i}] = True) before stepping it again"
                )
        ops: dict[int, tuple] = {}
        for i, action in zip(indices, acts):
            status = self._status[i]
            if status == LIVE:
                ops[i] = (step_kind, action)
            elif status == ENDED:  # NEXT_STEP autoreset, or any mode after a failure: the action is ignored
                ops[i] = (RESET, self._restart_seed[i], None)
        results = self._execute(ops, "step") if ops else {}

        count = len(indices)
        obs: list[Any] = [None] * count
        rewards = np.zeros(count, dtype=np.float64)
        terminated = np.zeros(count, dtype=bool)
        truncated = np.zeros(count, dtype=bool)
        infos: list[dict[str, Any]] = [{}] * count
        errors: list[VectorEnvError] = []
        for k, i in enumerate(indices):
            op = ops.get(i)
            if op is None:  # LOST: its episode vanished with its worker
                obs[k], truncated[k] = self._last_obs[i], True
                infos[k] = {"error": self._lost_reason[i], "worker_restarted": True, INFRA_ERROR: self._lost_reason[i]}
                self._lost_reason[i] = None
                self._status[i] = ENDED
                continue
            result = results[i]
            kind = result[0]
            if kind == OK:
                if op[0] == RESET:
                    obs[k], info = result[1]
                    infos[k] = {**info, "autoreset": True}
                    self._status[i] = LIVE
                    self._restart_seed[i] = None
                else:
                    obs[k], rewards[k], terminated[k], truncated[k], infos[k] = result[1]
                    if not same_step and (terminated[k] or truncated[k]):
                        self._status[i] = ENDED
                self._last_obs[i] = obs[k]
                continue
            obs[k], truncated[k] = self._last_obs[i], True
            self._status[i] = ENDED
            if kind == CRASH:
                infos[k] = {"error": result[1], "worker_restarted": True, INFRA_ERROR: result[1]}
            else:
                reason = f"env {i} raised {result[1]}"  # the env's own code failed, not the policy
                infos[k] = {"error": reason, "traceback": result[2], "worker_restarted": False, INFRA_ERROR: reason}
                errors.append(self._error_from(i, result, "step"))
        if errors and self.on_error == "raise":
            raise errors[0]
        return obs, rewards, terminated, truncated, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call method ``name`` with the given arguments on every env (e.g. ``"get_state"``); one result
        per env. A non-callable attribute is returned as is. ``reset``/``step``/``close`` are refused:
        use the vector env's own, which keep its bookkeeping right."""
        if name in _RESERVED_CALLS:
            raise ValueError(f"call({name!r}) would bypass the vector env's bookkeeping; use its own {name}()")
        return self._unwrap_calls(name, self._call(name, args, kwargs, True))

    def get_attr(self, name: str) -> list[Any]:
        """The attribute ``name`` of every env, in index order."""
        return self._unwrap_calls(name, self._call(name, (), {}, False))

    def close(self) -> None:
        """Close every env (and worker). Safe to call more than once."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        self._close()

    # -- plumbing ----------------------------------------------------------------------------------
    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # best effort: the interpreter may be shutting down
            pass

    def __len__(self) -> int:
        return self.num_envs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, autoreset_mode={self.autoreset_mode.name})"

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def _unwrap_calls(self, name: str, results: list[tuple]) -> list[Any]:
        for i, result in enumerate(results):
            if result[0] != OK:
                raise self._error_from(i, result, name) if result[0] == ERROR else VectorEnvError(f"env {i}: {name}: {result[1]}", env_index=i)
        return [result[1] for result in results]

    @staticmethod
    def _error_from(i: int, result: tuple, what: str) -> VectorEnvError:
        _, summary, remote_traceback, exc = result
        error = VectorEnvError(f"env {i} raised in {what}: {summary}\n{remote_traceback}", env_index=i, remote_traceback=remote_traceback)
        error.__cause__ = exc  # the original exception, when it ran in this process
        return error

    def _envs_rebuilt(self, indices: Iterable[int], reason: str, in_flight: Collection[int]) -> None:
        """Bookkeeping after envs were replaced by fresh ones (their worker died or timed out).

        Envs in ``in_flight`` get a ``CRASH`` result in the current call; the others lose their live
        episode, reported as truncated on their next step. All reset from a derived seed next time.
        """
        for i in indices:
            self._restarts[i] += 1
            self._restart_seed[i] = derive_restart_seed(self._seed_base[i], self._restarts[i])
            if i not in in_flight and self._status[i] == LIVE:
                self._status[i] = LOST
                self._lost_reason[i] = f"{reason}; this env's episode was lost with it"

    def _parse_actions(self, actions: Sequence[Any] | Mapping[int, Any]) -> tuple[list[int], list[Any]]:
        if isinstance(actions, Mapping):
            indices = []
            for key in actions:
                if isinstance(key, bool):
                    raise TypeError(f"step() dict keys are env indices (ints), got {key!r}")
                try:
                    index = operator.index(key)
                except TypeError:
                    raise TypeError(f"step() dict keys are env indices (ints), got {key!r}") from None
                if not 0 <= index < self.num_envs:
                    raise IndexError(f"env index {index} out of range for {self.num_envs} envs")
                indices.append(index)
            if len(set(indices)) != len(indices):
                raise ValueError("step() dict names an env twice")
            return indices, list(actions.values())
        if isinstance(actions, (str, bytes)):
            raise TypeError(
                f"step() takes one action per env (a sequence of num_envs actions) or a dict {{env_index: action}}, got a single {type(actions).__name__}"
            )
        acts = list(actions)
        if len(acts) != self.num_envs:
            raise ValueError(f"step() got {len(acts)} actions for {self.num_envs} envs; pass a dict {{env_index: action}} to step a subset")
        return list(range(self.num_envs)), acts

    def _parse_seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, (str, bytes)) or not isinstance(seed, Iterable):
            raise TypeError(f"seed must be an int, a list of num_envs ints/None, or None; got {type(seed).__name__}")
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset() got {len(seeds)} seeds for {self.num_envs} envs")
        for s in seeds:
            if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer))):
                raise TypeError(f"each seed must be an int or None, got {s!r}")
        return [None if s is None else int(s) for s in seeds]

    def _parse_reset_options(self, options: dict[str, Any] | None) -> tuple[list[bool], dict[str, Any] | None]:
        if options is None or "reset_mask" not in options:
            return [True] * self.num_envs, options
        env_options = {k: v for k, v in options.items() if k != "reset_mask"} or None
        mask = np.asarray(options["reset_mask"])
        if mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must be a sequence of {self.num_envs} bools, got dtype {mask.dtype} shape {mask.shape}")
        return mask.tolist(), env_options
