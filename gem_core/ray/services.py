"""Tool services on Ray: the Python sandbox on every node, one search server for every env.

* :class:`SandboxService` -- one actor per node, each owning a node-local gem_core
  :class:`~gem_core.tools.sandbox.SandboxPool` (that node's bubblewrap workers). A process that
  :meth:`~SandboxService.install`\\ s it (the ray backend's env actors do; any Ray worker may) has its
  shared sandbox pool forward each call to the actor on its own node (another node's when its own has
  none): ``PythonSandbox()``, the Python tool and the code graders run unchanged.
* :class:`SearchService` -- gem_core's search HTTP server (:func:`~gem_core.tools.search.make_search_server`
  over a BM25 index) in one actor; every env gets its address as ``GEM_SEARCH_URL``.

Both are started with :meth:`start` (and stopped by whoever started them) or found by name with
:meth:`connect`; a search server outside Ray is simply a URL.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from gem_core.ray.cluster import RayBackendError, connect, release
from gem_core.tools.factory import SEARCH_URL_VAR
from gem_core.tools.sandbox.host import RawReply, WorkerSpec

SANDBOX_PREFIX = "gem-sandbox"
SEARCH_PREFIX = "gem-search"
START_TIMEOUT_S = 120.0  # placing the service actors; a cluster that cannot place them fails, not hangs
ACTOR_CONCURRENCY = 256  # sandbox calls one actor serves at once (its pool queues those beyond its size)


def last_line(exc: BaseException) -> str:
    """The last non-empty line of an error's text: Ray puts the cause of an actor's death there."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1].rstrip(".") if lines else type(exc).__name__


def wait_placed(ray: Any, refs: list[Any], what: str, timeout: float, asked: str) -> list[Any]:
    """``ray.get`` of actors' first calls, or :class:`RayBackendError` when some are not placed in ``timeout``."""
    _, not_done = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if not_done:
        raise RayBackendError(
            f"{len(not_done)} of {len(refs)} {what} could not be placed within {timeout:g}s (each asks for {asked}); "
            f"the cluster has {_resources(ray.cluster_resources())}, {_resources(ray.available_resources())} free"
        )
    return ray.get(refs)


def _resources(table: dict[str, float]) -> str:
    shown = {k: v for k, v in table.items() if not k.startswith(("node:", "object_store_memory", "memory"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def node_affinity(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def alive_nodes(ray: Any) -> list[str]:
    return [node["NodeID"] for node in ray.nodes() if node.get("Alive")]


def named_actors(ray: Any, prefix: str, namespace: str | None) -> list[tuple[str, Any]]:
    """``(name, handle)`` of the named actors whose name starts with ``prefix`` (in ``namespace``, or this job's)."""
    namespace = namespace or ray.get_runtime_context().namespace
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == namespace and entry["name"].startswith(prefix):
            found.append((entry["name"], ray.get_actor(entry["name"], namespace=namespace)))
    return sorted(found, key=lambda item: item[0])


# ------------------------------------------------------------------------------------------------
# The sandbox.
# ------------------------------------------------------------------------------------------------


class SandboxHost:
    """The actor: this node's sandbox pools (one per worker spec), serving calls from any process."""

    def __init__(self, workers: int | None):
        from gem_core.tools.sandbox.pool import SandboxPool

        self._pool_class = SandboxPool
        self.workers = workers
        self.pools: dict[WorkerSpec, Any] = {}
        self._lock = threading.Lock()

    def where(self) -> tuple[str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def _pool(self, spec: WorkerSpec) -> Any:
        with self._lock:
            pool = self.pools.get(spec)
            if pool is None:
                pool = self.pools[spec] = self._pool_class(spec, self.workers)
            return pool

    def call(self, spec: WorkerSpec, request: bytes, timeout: float, cap: int, queue_timeout: float | None) -> tuple[RawReply, str | None]:
        return self._pool(spec).call(request, timeout, cap, queue_timeout)

    def start(self, spec: WorkerSpec) -> int:
        pool = self._pool(spec)
        pool.start()
        return pool.size

    def stats(self) -> dict[str, Any]:
        with self._lock:
            pools = list(self.pools.values())
        return {
            "size": self.workers,
            "workers": sum(p.workers for p in pools),
            "replaced": sum(p.replaced for p in pools),
            "worker_pids": [w.proc.pid for p in pools for w in p.live_workers()],
        }

    def close(self) -> None:
        for pool in list(self.pools.values()):
            pool.close()
        self.pools.clear()


class SandboxService:
    """Sandbox pool actors, one per node; see the module docstring. Picklable: hand it to any Ray task."""

    def __init__(self, actors: dict[str, Any], name: str | None = None, *, owned: bool = False, workers: int | None = None):
        self.actors = dict(actors)  # node id -> actor handle
        self.name = name
        self.workers = workers
        self._owned = owned

    @classmethod
    def start(
        cls,
        *,
        nodes: list[str] | None = None,
        workers_per_node: int | None = None,
        num_cpus: float = 0,
        name: str | None = None,
        namespace: str | None = None,
        address: str | None = None,
        timeout: float = START_TIMEOUT_S,
    ) -> SandboxService:
        """One sandbox actor on each of ``nodes`` (default: every alive node), pinned there, restarted by Ray
        if it dies. ``workers_per_node``: each node's pool size (default: fitted to that node's cores).
        ``num_cpus``: what each actor reserves (0: its workers' CPU is the pool size's business). ``name``:
        findable with :meth:`connect`."""
        ray = connect(address, namespace)
        try:
            remote = ray.remote(SandboxHost)
            nodes = list(nodes) if nodes is not None else alive_nodes(ray)
            actors = {}
            for node in nodes:
                options: dict[str, Any] = dict(num_cpus=num_cpus, scheduling_strategy=node_affinity(node), max_restarts=-1, max_concurrency=ACTOR_CONCURRENCY)
                if name:
                    options.update(name=f"{SANDBOX_PREFIX}:{name}:{node}", namespace=namespace)
                actors[node] = remote.options(**options).remote(workers_per_node)
            wait_placed(ray, [a.where.remote() for a in actors.values()], "sandbox actors", timeout, f"{num_cpus:g} CPU on its node")
        except BaseException:
            for actor in locals().get("actors", {}).values():
                ray.kill(actor, no_restart=True)
            release()
            raise
        return cls(actors, name, owned=True, workers=workers_per_node)

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> SandboxService:
        """The running service started with ``name`` (in ``namespace``, default this job's)."""
        ray = connect()
        try:
            found = named_actors(ray, f"{SANDBOX_PREFIX}:{name}:", namespace)
        finally:
            release()  # a connection only: the cluster's lifetime is not this handle's business
        if not found:
            raise RayBackendError(f"no sandbox service named {name!r} is running in this Ray cluster")
        return cls({n.rsplit(":", 1)[1]: actor for n, actor in found}, name)

    @property
    def node_ids(self) -> list[str]:
        return list(self.actors)

    def pool(self, spec: WorkerSpec) -> RemoteSandboxPool:
        """A pool for ``spec`` whose calls run on this service (the caller's node first)."""
        return RemoteSandboxPool(self, spec)

    def install(self) -> SandboxService:
        """Route this process's shared sandbox pools (every ``PythonSandbox()``) to this service."""
        from gem_core.tools.sandbox.pool import route_shared_pools

        route_shared_pools(self.pool)
        return self

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each node's pool: size, live workers, replaced workers, worker pids."""
        import ray

        return dict(zip(self.actors, ray.get([a.stats.remote() for a in self.actors.values()])))

    def stop(self) -> None:
        """Stop the actors (and their workers), if this handle started them. Safe to call twice."""
        if not self._owned:
            return
        self._owned = False
        import ray

        stop_actors(ray, list(self.actors.values()))
        release()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_owned": False}  # a copy elsewhere never stops what it did not start

    def __repr__(self) -> str:
        return f"SandboxService(nodes={len(self.actors)}, name={self.name!r})"


def stop_actors(ray: Any, actors: list[Any], grace: float = 5.0) -> None:
    """``close()`` each actor (its own cleanup), wait at most ``grace`` seconds, then ``ray.kill`` it."""
    refs = []
    for actor in actors:
        try:
            refs.append(actor.close.remote())
        except Exception:  # already gone
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=grace)
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass


class RemoteSandboxPool:
    """A sandbox pool's interface (what :class:`~gem_core.tools.sandbox.PythonSandbox` uses) whose calls run
    on a :class:`SandboxService` actor: the one on this process's node if there is one, else in turn."""

    def __init__(self, service: SandboxService, spec: WorkerSpec):
        import ray

        self.service = service
        self.spec = spec
        here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        local = service.actors.get(here)
        self._choices = itertools.cycle([(here, local)] if local is not None else list(service.actors.items()))
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        from gem_core.tools.sandbox.pool import default_size

        return self.service.workers or default_size()

    @property
    def replaced(self) -> int:
        return sum(stats["replaced"] for stats in self.service.stats().values())

    def acquire(self) -> None:
        """The service's lifetime is its owner's: handles neither open nor close it."""

    def release(self) -> None:
        """See :meth:`acquire`."""

    close = release

    def resize(self, size: int) -> None:
        """The service's pools are sized where they run (``SandboxService.start(workers_per_node=...)``)."""

    def start(self) -> None:
        import ray

        ray.get([actor.start.remote(self.spec) for actor in self.service.actors.values()])

    def call(self, request: bytes, timeout: float, cap: int, queue_timeout: float | None) -> tuple[RawReply, str | None]:
        import ray

        with self._lock:
            node, actor = next(self._choices)
        ref = actor.call.remote(self.spec, request, timeout, cap, queue_timeout)
        # The call's own limits bound it once it has a worker; queue_timeout bounds the wait for one.
        limit = None if queue_timeout is None else queue_timeout + timeout + 30.0
        try:
            return ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref)
            return RawReply(info={"service_timeout": True}), f"the sandbox service on node {node[:8]} did not answer within {limit:g} s"
        except ray.exceptions.RayActorError as exc:
            reply = RawReply(info={"worker_replaced": True})
            return reply, f"the sandbox service actor on node {node[:8]} was lost ({last_line(exc)}); the call did not complete"


# ------------------------------------------------------------------------------------------------
# Search.
# ------------------------------------------------------------------------------------------------


class SearchHost:
    """The actor: gem_core's search HTTP server over a BM25 index of ``corpus`` (read on this node)."""

    def __init__(self, corpus: str, port: int, topk: int):
        import ray

        from gem_core.tools.search import BM25Index, make_search_server

        self.server = make_search_server(BM25Index.from_jsonl(corpus), host="0.0.0.0", port=port, default_topk=topk)
        self._url = f"http://{ray.util.get_node_ip_address()}:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, name="gem-search-server", daemon=True).start()

    def url(self) -> str:
        return self._url

    def where(self) -> tuple[str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SearchService:
    """One search server for every env of the cluster: :attr:`url` (``GEM_SEARCH_URL``). Picklable."""

    def __init__(self, url: str, actor: Any = None, *, owned: bool = False):
        self.url = url
        self.actor = actor
        self._owned = owned

    @classmethod
    def start(
        cls,
        corpus: str | os.PathLike,
        *,
        node_id: str | None = None,
        port: int = 0,
        topk: int = 3,
        num_cpus: float = 0,
        name: str | None = None,
        namespace: str | None = None,
        address: str | None = None,
        timeout: float = START_TIMEOUT_S,
    ) -> SearchService:
        """Index the JSONL ``corpus`` and serve it from an actor on ``node_id`` (default: this process's
        node, where the path was given); ``port=0`` picks a free one. ``name``: findable with :meth:`connect`."""
        ray = connect(address, namespace)
        actor = None
        try:
            node_id = node_id or ray.get_runtime_context().get_node_id()
            options: dict[str, Any] = dict(num_cpus=num_cpus, scheduling_strategy=node_affinity(node_id))
            if name:
                options.update(name=f"{SEARCH_PREFIX}:{name}", namespace=namespace)
            actor = ray.remote(SearchHost).options(**options).remote(os.fspath(corpus), port, topk)
            try:
                (url,) = wait_placed(ray, [actor.url.remote()], "search server actors", timeout, f"{num_cpus:g} CPU")
            except ray.exceptions.RayActorError as exc:
                raise RayBackendError(f"the search server could not start: {last_line(exc)}") from None
        except BaseException:
            if actor is not None:
                ray.kill(actor, no_restart=True)
            release()
            raise
        return cls(url, actor, owned=True)

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> SearchService:
        """The running server started with ``name``."""
        ray = connect()
        try:
            found = named_actors(ray, f"{SEARCH_PREFIX}:{name}", namespace)
            if not found:
                raise RayBackendError(f"no search service named {name!r} is running in this Ray cluster")
            return cls(ray.get(found[0][1].url.remote()), found[0][1])
        finally:
            release()

    @property
    def env_vars(self) -> dict[str, str]:
        """What an env process needs to use it (:func:`gem_core.tools.factory.make_tool` reads ``GEM_SEARCH_URL``)."""
        return {SEARCH_URL_VAR: self.url}

    def stop(self) -> None:
        """Stop the server, if this handle started it. Safe to call twice."""
        if not self._owned:
            return
        self._owned = False
        import ray

        stop_actors(ray, [self.actor])
        release()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_owned": False}

    def __repr__(self) -> str:
        return f"SearchService(url={self.url!r})"
