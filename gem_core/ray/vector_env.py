"""RayVectorEnv: envs packed into Ray actors anywhere on a cluster, one actor call per actor per step.

The same parent-side logic as the other backends (:class:`~gem_core.vector.sharded.ShardedVectorEnv`):
each actor hosts a contiguous shard of ``envs_per_actor`` envs and serves the same requests an async
worker process does (:func:`~gem_core.vector.sharded.serve_request`), so API, autoreset modes,
determinism and crash reporting are those of :class:`~gem_core.vector.AsyncVectorEnv`. Ray is
imported only when one is built (``pip install 'gem-core[ray]'``).
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable, Iterable, Mapping
from numbers import Real
from typing import Any, ClassVar

from gem_core.params import Param, check_args, invalid
from gem_core.ray.cluster import connect, release, require_ray
from gem_core.ray.services import SandboxService, SearchService, last_line, stop_actors, wait_placed
from gem_core.vector.sharded import ShardedVectorEnv, build_envs, close_envs, dumps, serve_request
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, VectorEnvError

_STARTUP_TIMEOUT_S = 300.0  # a replacement actor building its envs; generous, it only guards against a hang
_CLOSE_GRACE_S = 5.0  # how long close() lets actors close their envs before killing them
_STRATEGIES = ("DEFAULT", "SPREAD")


class EnvHost:
    """The actor: one shard of envs, built where the actor runs, serving one request at a time."""

    def __init__(self, env_fns: list[Callable[[], Any]], env_indices: list[int], env_vars: dict[str, str], sandbox: Any):
        os.environ.update(env_vars)  # before the envs are built: tools read GEM_SEARCH_URL when made
        if sandbox is not None:
            sandbox.install()  # this process's PythonSandbox() calls go to the sandbox service
        self.env_indices = env_indices
        self.envs, self.error = build_envs(env_fns, env_indices)

    def ready(self) -> tuple:
        import ray

        if self.error is not None:
            return ("init_error", self.error)
        return ("ready", os.getpid(), ray.get_runtime_context().get_node_id())

    def handle(self, message: bytes) -> bytes:
        if self.error is not None:
            return dumps(("init_error", self.error))
        return serve_request(self.envs, self.env_indices, message)

    def close(self) -> None:
        close_envs(self.envs)
        self.envs = {}


class RayVectorEnv(ShardedVectorEnv):
    """Runs its envs in Ray actors, at most ``envs_per_actor`` per actor, on any node of a Ray cluster.

    ``env_fns``: zero-argument callables returning an env (``gem_core.make_vec`` builds them); Ray's
    serializer ships them, so lambdas work, but the env's module must be importable on the nodes.

    Where the envs run: ``envs_per_actor`` (default: the envs spread over the cluster's CPUs, one
    actor per ``num_cpus`` of them; shards are contiguous and balanced, so 7 envs at 3 per actor are
    3 + 2 + 2); each actor reserves ``num_cpus`` CPUs (default 1) and the custom
    ``resources`` (e.g. ``{"env_node": 1}``); ``scheduling_strategy`` is ``"SPREAD"`` (default: over the
    nodes), ``"DEFAULT"`` or any Ray strategy object (``NodeAffinitySchedulingStrategy``...);
    ``placement_group``: a ready placement group whose bundles take the actors in turn (actor ``a`` in
    bundle ``a % bundles``). ``runtime_env``: the actors' Ray runtime env.

    Which cluster: the one this process is already connected to (inside verl's or OpenRLHF's Ray job);
    else ``address`` (``"host:port"`` of a head, ``"auto"``), else ``RAY_ADDRESS`` or a cluster
    ``ray start`` left on this machine; else a local one is started, and shut down when the last
    gem_core user of it closes. ``namespace`` goes to ``ray.init``. An address that does not answer,
    and actors the cluster cannot place within ``init_timeout`` seconds, raise
    :class:`~gem_core.ray.cluster.RayBackendError`.

    Tools: ``sandbox=True`` starts a :class:`~gem_core.ray.services.SandboxService` (a sandbox pool
    actor per node) for these envs and stops it at :meth:`close`; pass a running service to share it.
    The env actors' ``PythonSandbox()`` calls (Python tool, code graders) then run on their node's
    pool. ``search``: a :class:`~gem_core.ray.services.SearchService`, a server URL
    (``http://host:port``), or a JSONL corpus path (a server is started and stopped with these envs);
    the envs get it as ``GEM_SEARCH_URL``.

    A dead actor (``ray.kill``, its node lost, its process killed) or one that overruns
    ``step_timeout`` is replaced by a fresh one with fresh envs and the call returns: its stepped envs
    come back ``truncated=True`` with ``info["error"]`` (``"env actor 1 died (...)"``) and
    ``info["worker_restarted"] = True``; the rest is as in :class:`~gem_core.vector.AsyncVectorEnv`.
    """

    params: ClassVar[dict[str, Param]] = {
        **VectorEnv.params,
        "envs_per_actor": Param(int, low=1, none="the envs spread over the cluster's CPUs"),
        "num_cpus": Param(float, above=0),
        "step_timeout": Param(float, above=0, none="no time limit"),
        "init_timeout": Param(float, above=0),
        "address": Param(str, none="the running cluster, else a new local one"),
        "namespace": Param(str, none="Ray's default"),
    }

    @classmethod
    def check_backend(cls) -> None:
        require_ray()  # Ray missing: one line naming the extra

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Any]],
        *,
        envs_per_actor: int | None = None,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        scheduling_strategy: Any = "SPREAD",
        placement_group: Any = None,
        runtime_env: dict[str, Any] | None = None,
        address: str | None = None,
        namespace: str | None = None,
        step_timeout: float | None = None,
        init_timeout: float = 120.0,
        sandbox: Any = None,
        search: Any = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        on_error: str = "raise",
    ):
        env_fns = list(env_fns)
        args = dict(envs_per_actor=envs_per_actor, num_cpus=num_cpus, resources=resources, scheduling_strategy=scheduling_strategy,
                    placement_group=placement_group, address=address, namespace=namespace, step_timeout=step_timeout,
                    init_timeout=init_timeout, sandbox=sandbox, search=search)  # fmt: skip
        check_args(RayVectorEnv, args, type(self).__name__)
        if not env_fns:
            raise invalid("env_fns", 0, "at least one env", type(self).__name__)
        self._ray = ray = connect(address, namespace)
        self._connected = True  # one use of the cluster, released by close()
        self._actors: list[Any] = []
        self._owned_services: list[Any] = []
        try:
            if envs_per_actor is None:
                slots = max(1, int(ray.cluster_resources().get("CPU", 1) // num_cpus))
                envs_per_actor = math.ceil(len(env_fns) / slots)
            super().__init__(len(env_fns), math.ceil(len(env_fns) / envs_per_actor), autoreset_mode, on_error)
            self.envs_per_actor = envs_per_actor
            self.step_timeout = step_timeout
            self._env_fns = env_fns
            self._options = self._actor_options(num_cpus, resources, scheduling_strategy, runtime_env)
            self._placement_group = placement_group
            self.sandbox, self.search = self._services(sandbox, search, address, namespace)
            self._env_vars = dict(self.search.env_vars) if self.search is not None else {}
            self._ready = [False] * len(self._shard_envs)
            self._actors = [self._new_actor(s) for s in range(len(self._shard_envs))]
            asked = ", ".join(f"{k}: {v:g}" for k, v in {"CPU": num_cpus, **dict(resources or {})}.items())
            replies = wait_placed(ray, [actor.ready.remote() for actor in self._actors], "env actors", init_timeout, asked)
            for s, reply in enumerate(replies):
                if reply[0] == "init_error":
                    raise VectorEnvError(f"env actor {s} could not build its envs:\n{reply[1]}", remote_traceback=reply[1])
            self.actor_pids = [reply[1] for reply in replies]
            self.actor_nodes = [reply[2] for reply in replies]
            self._ready = [True] * len(self._actors)
        except BaseException:
            self.closed = False  # set up or not, close() stops what was started and releases the cluster
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------------------
    @classmethod
    def check_params(cls, args: dict[str, Any]) -> None:
        """The arguments Param cannot describe: resources, scheduling, tools."""
        resources = args.get("resources")
        if resources is not None:
            ok = isinstance(resources, Mapping) and all(
                isinstance(k, str) and isinstance(v, Real) and not isinstance(v, bool) and v >= 0 for k, v in resources.items()
            )
            if not ok or {"CPU", "GPU"} & set(resources or {}):
                raise invalid("resources", resources, "a dict of custom resource names to amounts >= 0 (CPUs: num_cpus)", wrong_type=not ok)
        strategy = args.get("scheduling_strategy")
        if isinstance(strategy, str) and strategy not in _STRATEGIES:
            raise invalid("scheduling_strategy", strategy, f"one of {', '.join(map(repr, _STRATEGIES))} or a Ray scheduling strategy")
        if args.get("placement_group") is not None and args.get("scheduling_strategy") not in (None, "SPREAD", "DEFAULT"):
            raise invalid("placement_group", args["placement_group"], "None when scheduling_strategy is a strategy object")
        sandbox = args.get("sandbox")
        if sandbox is not None and not isinstance(sandbox, bool) and not hasattr(sandbox, "install"):
            raise invalid("sandbox", sandbox, "True (start one), a SandboxService, or None", wrong_type=True)
        search = args.get("search")
        if search is not None and not isinstance(search, (str, os.PathLike)) and not hasattr(search, "env_vars"):
            raise invalid("search", search, "a SearchService, a server URL, a corpus path, or None", wrong_type=True)

    @staticmethod
    def _actor_options(num_cpus: float, resources: Mapping[str, float] | None, strategy: Any, runtime_env: dict | None) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "scheduling_strategy": strategy}
        if resources:
            options["resources"] = dict(resources)
        if runtime_env:
            options["runtime_env"] = runtime_env
        return options

    def _services(self, sandbox: Any, search: Any, address: str | None, namespace: str | None) -> tuple[Any, Any]:
        """The sandbox and search services the envs use, starting (and owning) those asked for by value."""
        if sandbox is True:
            sandbox = SandboxService.start(address=address, namespace=namespace)
            self._owned_services.append(sandbox)
        elif sandbox is False:
            sandbox = None
        if isinstance(search, (str, os.PathLike)):
            text = os.fspath(search)
            if text.startswith(("http://", "https://")):
                search = SearchService(text)
            else:
                search = SearchService.start(text, address=address, namespace=namespace)
                self._owned_services.append(search)
        return sandbox, search

    def _new_actor(self, shard: int) -> Any:
        options = dict(self._options)
        if self._placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundles = self._placement_group.bundle_count
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._placement_group, placement_group_bundle_index=shard % bundles)
        indices = self._shard_envs[shard]
        remote = self._ray.remote(EnvHost).options(**options)
        return remote.remote([self._env_fns[i] for i in indices], indices, self._env_vars, self.sandbox)

    # -- introspection -------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The actor handle of each shard (changes when an actor is replaced)."""
        return list(self._actors)

    def actor_of(self, env_index: int) -> int:
        """The index of the actor hosting env ``env_index``."""
        return self._shard_of[env_index]

    def _host_name(self, shard: int) -> str:
        return f"env actor {shard}"

    # -- ShardedVectorEnv hooks -----------------------------------------------------------------------
    def _restart_shard(self, shard: int) -> None:
        try:
            self._ray.kill(self._actors[shard], no_restart=True)
        except Exception:  # already gone
            pass
        self._actors[shard] = self._new_actor(shard)
        self._ready[shard] = False

    def _exchange(self, messages: dict[int, bytes], what: str) -> tuple[dict[int, tuple], dict[int, str]]:
        ray = self._ray
        timeout = self.step_timeout
        pending: dict[Any, int] = {}
        deadlines: dict[int, float] = {}
        sent_at = time.monotonic()
        for s, payload in messages.items():
            pending[self._actors[s].handle.remote(payload)] = s
            limit = timeout if self._ready[s] else _STARTUP_TIMEOUT_S + (timeout or 0.0)  # a new actor builds its envs first
            if limit is not None:
                deadlines[s] = sent_at + limit
        replies: dict[int, tuple] = {}
        failures: dict[int, str] = {}
        try:
            while pending:
                due = [deadlines[s] for s in pending.values() if s in deadlines]
                wait_s = max(0.0, min(due) - time.monotonic()) if due else None
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
                for ref in done:
                    s = pending.pop(ref)
                    try:
                        replies[s] = pickle.loads(ray.get(ref))
                        self._ready[s] = True
                    except ray.exceptions.RayActorError as exc:
                        failures[s] = self._death_reason(s, exc)
                    except ray.exceptions.RayError as exc:  # the request itself failed: nothing to hand back
                        replies[s] = ("fatal", str(exc))
                now = time.monotonic()
                for ref, s in list(pending.items()):
                    if s in deadlines and now >= deadlines[s]:
                        pending.pop(ref)
                        if self._ready[s]:
                            failures[s] = f"{what} timed out after {timeout}s (env actor {s} was killed)"
                        else:
                            failures[s] = f"env actor {s} did not rebuild its envs within {_STARTUP_TIMEOUT_S:g}s (it was killed)"
        except BaseException:
            # Interrupted (e.g. Ctrl-C) with calls outstanding: those envs' state is unknown. Replace them.
            for s in set(pending.values()):
                self._restart_shard(s)
                self._envs_rebuilt(self._shard_envs[s], f"env actor {s} was restarted after an interrupted {what}", in_flight=())
            raise
        return replies, failures

    def _death_reason(self, shard: int, exc: BaseException) -> str:
        return f"env actor {shard} died ({last_line(exc)})"

    def _close(self) -> None:
        if not getattr(self, "_connected", False):
            return
        try:
            if self._actors:
                stop_actors(self._ray, self._actors, _CLOSE_GRACE_S)
            for service in reversed(self._owned_services):
                service.stop()
        finally:
            self._connected = False
            release()
