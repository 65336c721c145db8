"""The env registry: ids, specs and ``make`` (``make_vec``, above it, is in :mod:`gem_core.vector.make`).

Ids look like ``category:Name-vN[-variant]`` (``game:Sudoku-v0-easy``). Entry points are
``"module:Class"`` strings, imported only when an env is made, so registering costs nothing.
Third-party packages register envs through the ``gem_core.envs`` entry-point group: each entry point
names a callable (or module) that calls :func:`register` when loaded.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gem_core.errors import RegistrationError, UnknownEnvError, UnknownKwargError, suggest
from gem_core.params import check_args

if TYPE_CHECKING:
    from gem_core.core import Env

ENTRY_POINT_GROUP = "gem_core.envs"
ID_PATTERN = re.compile(r"^(?P<category>[a-z][a-z0-9_]*):(?P<name>[A-Za-z0-9_.]+)(?:-v(?P<version>\d+))?(?:-(?P<variant>[A-Za-z0-9_.-]+))?$")


@dataclass(frozen=True)
class EnvSpec:
    """What ``make`` needs to build an env: its id, where the class lives and its default kwargs."""

    id: str
    entry_point: str | Callable[..., Env]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def category(self) -> str:
        return self.id.split(":", 1)[0]

    def load(self) -> Callable[..., Env]:
        """Import and return the env class (or factory) this spec points at."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        module = importlib.import_module(module_name)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise RegistrationError(f"{self.id}: entry point {self.entry_point!r} has no attribute {attr!r}") from None

    def make(self) -> Env:
        """A fresh env of this spec with its registered kwargs (``Env.spawn(same_state=False)``)."""
        return make(self.id, **self.kwargs)


registry: dict[str, EnvSpec] = {}
alias_table: dict[str, str] = {}
#: Id prefixes that name an env outside the registry, each with the entry point that builds it from the rest
#: of the id (passed as ``url=``): ``openenv:<url>`` is one session of an OpenEnv server (``gem_core.serve``).
id_prefixes: dict[str, str] = {"openenv": "gem_core.serve.remote:OpenEnvEnv"}
_plugins_loaded = False


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    description: str = "",
    aliases: Iterable[str] = (),
    override: bool = False,
    **kwargs: Any,
) -> EnvSpec:
    """Register an env id. ``kwargs`` are the defaults passed to the entry point by ``make``.

    ``aliases`` are other ids that resolve to this one (e.g. ids used by the GEM paper).
    Registering an existing id is an error unless ``override=True``.
    """
    if not ID_PATTERN.match(id):
        raise RegistrationError(f"env id {id!r} is not of the form 'category:Name-vN[-variant]' (e.g. 'game:Sudoku-v0-easy')")
    if isinstance(entry_point, str) and ":" not in entry_point:
        raise RegistrationError(f"{id}: entry point {entry_point!r} must look like 'package.module:ClassName'")
    if not override and (id in registry or id in alias_table):
        raise RegistrationError(f"env id {id!r} is already registered; pass override=True to replace it")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs), description=description)
    registry[id] = spec
    for alias in aliases:
        register_alias(alias, id, override=override)
    return spec


def register_alias(alias: str, target: str, *, override: bool = False) -> None:
    """Make ``alias`` resolve to the registered id ``target``."""
    if target not in registry:
        raise RegistrationError(f"alias {alias!r} points at unknown id {target!r}")
    if not override and (alias in registry or alias in alias_table):
        raise RegistrationError(f"alias {alias!r} is already taken")
    alias_table[alias] = target


def _load_plugins() -> None:
    """Load third-party registrations from the ``gem_core.envs`` entry-point group, once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken plugin must not take the core down
            import warnings

            warnings.warn(f"gem_core: could not load env plugin {ep.name!r} ({ep.value}): {exc!r}", stacklevel=2)
            continue
        if callable(loaded) and not inspect.isclass(loaded):
            loaded()


def resolve(id: str) -> str:
    """The registered id that ``id`` names (itself, or the target of an alias)."""
    if id in registry:
        return id
    if id in alias_table:
        return alias_table[id]
    _load_plugins()
    if id in registry:
        return id
    if id in alias_table:
        return alias_table[id]
    if not isinstance(id, str):
        raise UnknownEnvError(f"env id must be a string, got {type(id).__name__}")
    hint = suggest(id, list(registry) + list(alias_table))
    raise UnknownEnvError(f"no env registered as {id!r}.{hint} (`gem-core list` shows every id)")


def spec(id: str) -> EnvSpec:
    """The :class:`EnvSpec` of an id or alias (or of a prefixed id such as ``openenv:<url>``: :data:`id_prefixes`)."""
    if isinstance(id, str) and id not in registry and id not in alias_table:
        prefix, _, rest = id.partition(":")
        if rest and prefix in id_prefixes:
            return EnvSpec(id=id, entry_point=id_prefixes[prefix], kwargs={"url": rest}, description=f"{prefix} env at {rest}")
    return registry[resolve(id)]


def list_envs(category: str | None = None) -> list[str]:
    """Registered ids (aliases excluded), sorted, optionally of one category (``"game"``)."""
    _load_plugins()
    ids = sorted(registry)
    if category is not None:
        ids = [i for i in ids if registry[i].category == category]
    return ids


def accepted_kwargs(factory: Callable[..., Any]) -> set[str] | None:
    """Names ``factory`` accepts as keywords, or ``None`` if it takes ``**kwargs`` (anything goes)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    params = inspect.signature(target).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) and p.name != "self"}


def make(id: str, wrappers: Sequence[Callable[[Env], Env]] = (), **kwargs: Any) -> Env:
    """Build the env registered as ``id`` (or an alias), with ``kwargs`` overriding its defaults.

    Unknown kwargs are rejected with the list of accepted ones. ``wrappers`` are applied in order,
    innermost first.
    """
    return make_from_spec(spec(id), wrappers, **kwargs)


def check_kwargs(env_spec: EnvSpec, kwargs: dict[str, Any]) -> tuple[Callable[..., Env], dict[str, Any]]:
    """The spec's factory and its kwargs (the spec's defaults under ``kwargs``), checked: names the
    factory does not take (:class:`UnknownKwargError`, with close matches), then the types and ranges
    the env class declares (``params``, ``check_params``: :mod:`gem_core.params`), as one
    :class:`~gem_core.errors.InvalidArgumentError` naming the id, the argument, the value and what is
    allowed. Builds nothing, so ``make_vec`` runs it in the caller before any worker starts."""
    factory = env_spec.load()
    merged = {**env_spec.kwargs, **kwargs}
    allowed = accepted_kwargs(factory)
    if allowed is not None:
        unknown = sorted(set(merged) - allowed)
        if unknown:
            hints = "".join(suggest(k, allowed) for k in unknown)
            raise UnknownKwargError(
                f"{env_spec.id} does not take {', '.join(map(repr, unknown))}.{hints} It accepts: {', '.join(sorted(allowed)) or '(nothing)'}.",
                name=unknown[0],
                value=merged[unknown[0]],
                allowed=", ".join(sorted(allowed)),
            )
    check_args(factory, merged, env_spec.id)
    return factory, merged


_BUILDING: ContextVar[str | None] = ContextVar("gem_core_building_id", default=None)


def building_id() -> str | None:
    """The id ``make`` is building right now (for an env constructor's error messages), else None."""
    return _BUILDING.get()


def make_from_spec(env_spec: EnvSpec, wrappers: Sequence[Callable[[Env], Env]] = (), **kwargs: Any) -> Env:
    """Build an env from a spec (no registry lookup: works in a worker process that never saw the id)."""
    factory, merged = check_kwargs(env_spec, kwargs)
    token = _BUILDING.set(env_spec.id)
    try:
        env = factory(**merged)
    finally:
        _BUILDING.reset(token)
    from gem_core.core import Env as _Env

    if not isinstance(env, _Env):
        raise RegistrationError(f"{env_spec.id}: entry point returned {type(env).__name__}, not a gem_core Env")
    env.unwrapped.spec = EnvSpec(id=env_spec.id, entry_point=env_spec.entry_point, kwargs=merged, description=env_spec.description)
    for wrap in wrappers:
        env = wrap(env)
    return env


@dataclass(frozen=True)
class EnvFactory:
    """A picklable ``() -> Env`` for vector workers. It carries the spec, not just the id, so a worker
    process builds the env even if the id was registered at run time in the parent only."""

    spec: EnvSpec
    wrappers: tuple[Callable[[Env], Env], ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Env:
        return make_from_spec(self.spec, self.wrappers, **self.kwargs)
