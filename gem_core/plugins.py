"""The base every trainer plugin uses: versions, estimator install/uninstall, the engine adapter.

A plugin (``gem_integrations.<trainer>``) is thin. What two plugins would share lives here:

* :class:`TrainerPlugin`: the trainer's distribution name and the versions the plugin is tested
  against (:meth:`~TrainerPlugin.check_version` raises one clear :class:`PluginError` otherwise), and
  the plugin's :class:`Patch`\\ es, installed and uninstalled together. A trainer with an advantage
  registry (verl) needs no patch for the estimator; one without (OpenRLHF, RL2) wraps a method, and
  uninstalling puts back exactly what was there, leaving every other estimator unchanged.
* :class:`~gem_core.rollout.engine.EnginePolicy` (re-exported here): a gem_core
  :class:`~gem_core.rollout.Policy` over an engine that answers in vLLM's terms (token ids with the stop
  token, vLLM finish reasons); a plugin implements :meth:`~EnginePolicy.request` for its trainer's call shape.
* Plugins are found through the ``gem_core.plugins`` entry-point group (:func:`discover`): the
  ``gem-core`` command adds each plugin's ``make-dataset`` writer and subcommands without importing
  any trainer.

The dataset-row schema is :class:`gem_core.tasks.TaskSpec`; the token-level batch with explicit turn
ids is :mod:`gem_core.batch`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gem_core.errors import GemError
from gem_core.rollout.engine import EnginePolicy, copy_params, finish_reason, sampling_from_vllm

ENTRY_POINT_GROUP = "gem_core.plugins"
__all__ = ["EnginePolicy", "Patch", "PluginError", "TrainerPlugin", "copy_params", "discover", "finish_reason", "sampling_from_vllm"]


class PluginError(GemError):
    """A trainer plugin cannot run here: the trainer is missing, its version is unsupported, or a
    patch target moved. The message says which, and what to install."""


# ------------------------------------------------------------------------------------------------
# Patches: a method wrapped, and put back exactly.
# ------------------------------------------------------------------------------------------------

_PATCH_MARK = "__gem_core_patch__"


@dataclass
class Patch:
    """Replace ``owner.attribute`` (``owner`` given as ``"module:Class"`` or ``"module"``) with
    ``make(original)``. :meth:`apply` is idempotent; :meth:`revert` restores the original object only
    if the current one is still this patch's (another patch on top is left alone, and reported).
    ``optional``: the attribute exists in only some of the supported versions; where it does not, the patch is
    :meth:`absent` and applies as nothing (its module must still import)."""

    target: str
    attribute: str
    make: Callable[[Any], Any]
    optional: bool = False
    _applied: Any = field(default=None, init=False, repr=False)
    _original: Any = field(default=None, init=False, repr=False)

    def _parent(self) -> Any:
        """The object that holds (or would hold) the attribute, or None where a class on the way is missing."""
        module_name, _, qualname = self.target.partition(":")
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginError(f"cannot patch {self.target}.{self.attribute}: {exc}") from exc
        for part in filter(None, qualname.split(".")):
            owner = getattr(owner, part, None)
            if owner is None:
                return None
        return owner

    def owner(self) -> Any:
        owner = self._parent()
        if owner is None or not hasattr(owner, self.attribute):
            raise PluginError(f"cannot patch {self.target}.{self.attribute}: it does not exist in this version")
        return owner

    def absent(self) -> bool:
        """An optional patch whose target this version lacks."""
        if not self.optional:
            return False
        owner = self._parent()
        return owner is None or not hasattr(owner, self.attribute)

    @property
    def applied(self) -> bool:
        if self.absent():
            return True  # nothing to replace in this version
        return self._applied is not None and self.owner().__dict__.get(self.attribute) is self._applied

    def apply(self) -> None:
        if self.absent():
            return
        owner = self.owner()
        current = owner.__dict__.get(self.attribute, getattr(owner, self.attribute))
        if getattr(current, _PATCH_MARK, None) is self:
            return
        replacement = self.make(current)
        try:
            setattr(replacement, _PATCH_MARK, self)
        except (AttributeError, TypeError):  # a builtin or a staticmethod object: marked by identity only
            pass
        self._original, self._applied = current, replacement
        setattr(owner, self.attribute, replacement)

    def revert(self) -> bool:
        """Put the original back; False when the attribute is no longer this patch's (left alone)."""
        if self._applied is None:
            return True
        owner = self.owner()
        if owner.__dict__.get(self.attribute) is not self._applied:
            return False
        setattr(owner, self.attribute, self._original)
        self._applied = self._original = None
        return True


# ------------------------------------------------------------------------------------------------
# Patching when a module is first imported.
# ------------------------------------------------------------------------------------------------
# A trainer's setup hook runs in every one of its processes (verl's plugin entry point at `import verl`,
# OpenRLHF's Ray worker setup hook), inference engine actors included. Importing the module to patch
# there would load the whole training stack (deepspeed, ...) into processes that never need it, so a
# plugin asks to be called right after that module is first executed, in whichever process does.


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and runs the callbacks once the module has executed."""

    def __init__(self, name: str):
        self.name = name
        self.callbacks: list[Callable[[Any], None]] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, hook: _AfterImport):
        self.inner = inner
        self.hook = hook

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        cancel_when_imported(self.hook.name)
        for callback in self.hook.callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self.inner, name)


def when_imported(module_name: str, callback: Callable[[Any], None]) -> None:
    """``callback(module)`` now if ``module_name`` is loaded, else right after it is first imported
    (once; a callback already waiting for that module is not added twice)."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == module_name), None)
    if hook is None:
        hook = _AfterImport(module_name)
        sys.meta_path.insert(0, hook)
    if callback not in hook.callbacks:
        hook.callbacks.append(callback)


def waiting_for_import(module_name: str) -> bool:
    """Whether a callback waits for ``module_name`` to be imported."""
    return any(isinstance(f, _AfterImport) and f.name == module_name for f in sys.meta_path)


def cancel_when_imported(module_name: str) -> None:
    """Drop every callback waiting for ``module_name`` (callbacks that already ran are not undone)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == module_name)]


# ------------------------------------------------------------------------------------------------
# The plugin base.
# ------------------------------------------------------------------------------------------------


@dataclass
class TrainerPlugin:
    """One trainer's plugin: what it needs installed and what it changes in the trainer.

    ``distribution``: the trainer's name on the package index (``verl``, ``openrlhf``); ``supported``:
    a PEP 440 specifier of the versions tested (``">=0.9,<0.10"``); ``module``: the trainer's import
    name. ``estimators``: the advantage estimators the plugin adds (names the trainer's config
    selects). ``patches``: what :meth:`install` applies and :meth:`uninstall` reverts, in order.
    ``register``: called by :meth:`install` for trainers with a registry (returns nothing).
    ``dataset``: the module that writes this trainer's dataset (``add_arguments(parser)``,
    ``main(args)``); ``commands``: a module with ``add_arguments(parser)`` and ``main(args)`` for
    ``gem-core <name> ...``; ``experiment``: the module that writes this trainer's own configuration of an
    experiment file (``render(experiment, source) -> str``; ``gem-core experiment FILE --trainer <name>``;
    it imports without the trainer).
    """

    name: str
    distribution: str
    supported: str
    module: str
    estimators: tuple[str, ...] = ()
    patches: Sequence[Patch] = ()
    register: Callable[[], None] | None = None
    dataset: str | None = None
    commands: str | None = None
    description: str = ""
    experiment: str | None = None

    def installed_version(self) -> str | None:
        """The trainer's installed version, or None when it is not installed."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def check_version(self) -> str:
        """The installed version, if supported; else a :class:`PluginError` saying what to install."""
        version = self.installed_version()
        if version is None:
            raise PluginError(
                f"{self.name}: {self.distribution} is not installed (pip install -e '.[{self.name}]'; tested: {self.distribution}{self.supported})"
            )
        if not version_matches(version, self.supported):
            raise PluginError(f"{self.name}: {self.distribution} {version} is not supported by this plugin (tested: {self.distribution}{self.supported})")
        return version

    def install(self, *, check: bool = True) -> None:
        """Check the version, register the estimators and apply the patches (idempotent). On a failure
        midway, whatever was applied is reverted before the error propagates."""
        if check:
            self.check_version()
        if self.register is not None:
            self.register()
        done: list[Patch] = []
        try:
            for patch in self.patches:
                patch.apply()
                done.append(patch)
        except BaseException:
            for patch in reversed(done):
                patch.revert()
            raise

    def uninstall(self) -> list[str]:
        """Revert the patches (newest first); returns the targets that could not be reverted because
        something else patched them since (they are left as they are)."""
        stuck = []
        for patch in reversed(list(self.patches)):
            if not patch.revert():
                stuck.append(f"{patch.target}.{patch.attribute}")
        return stuck

    @property
    def is_installed(self) -> bool:
        """Whether every patch is in place."""
        return all(patch.applied for patch in self.patches)


def version_matches(version: str, specifier: str) -> bool:
    """Whether ``version`` satisfies the PEP 440 ``specifier`` (uses ``packaging``, which pip and every
    trainer bring; a plain comparison of release numbers without it)."""
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version) in SpecifierSet(specifier)
    except ImportError:  # pragma: no cover - packaging is everywhere pip is
        return _release_matches(version, specifier)


def _release_matches(version: str, specifier: str) -> bool:
    def release(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("+")[0].split(".") if p.isdigit())

    have = release(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        for op in (">=", "<=", "==", "!=", ">", "<"):
            if clause.startswith(op):
                want = release(clause[len(op) :])
                ok = {
                    ">=": have >= want,
                    "<=": have <= want,
                    "==": have[: len(want)] == want,
                    "!=": have[: len(want)] != want,
                    ">": have > want,
                    "<": have < want,
                }[op]
                if not ok:
                    return False
                break
    return True


# ------------------------------------------------------------------------------------------------
# Discovery.
# ------------------------------------------------------------------------------------------------


def discover() -> dict[str, TrainerPlugin]:
    """Every plugin registered in the ``gem_core.plugins`` entry-point group, by name. Loading one
    imports its small descriptor module only, never the trainer."""
    found: dict[str, TrainerPlugin] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = entry.load()
        except Exception as exc:  # a broken third-party plugin must not break the CLI
            found.setdefault(entry.name, TrainerPlugin(entry.name, entry.name, "", entry.name, description=f"(failed to load: {exc})"))
            continue
        if isinstance(plugin, TrainerPlugin):
            found[plugin.name] = plugin
    return dict(sorted(found.items()))
