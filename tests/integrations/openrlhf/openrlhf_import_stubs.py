"""IMPORT STUB: vllm, deepspeed and flash_attn, so that OpenRLHF's own CPU code can be exercised.

OpenRLHF 0.11.2 imports these GPU-only packages at module level (``openrlhf.trainer.ray.vllm_engine``
imports vllm; ``openrlhf.models.utils`` and ``openrlhf.utils.deepspeed`` import deepspeed). None of the
code under test calls into them: the agent executor, ``_load_agent_executor``,
``_process_response_into_experience`` and ``compute_advantages_and_returns`` are plain Python/torch.
This file makes those three names importable as empty placeholder modules, nothing more: any attribute
is a placeholder class that raises if it is ever *called*, so a test that reached real vllm/deepspeed
code would fail loudly instead of passing by accident. Every other module (openrlhf itself, ray, torch,
transformers) is the real installed package.

``install()`` is idempotent; it is called by this folder's conftest and by the Ray worker setup hook
of the Ray test (``install_then_arm``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("vllm", "deepspeed", "flash_attn")
# Optional kernels OpenRLHF imports inside ``try: ... except ImportError`` with a plain-torch fallback
# (``openrlhf.models.utils.log_probs_from_logits``): absent, as on a machine without flash-attn's Triton
# kernels, so OpenRLHF takes its own fallback instead of reaching a placeholder.
ABSENT = ("flash_attn.ops",)


class _Placeholder:
    """What any attribute of a stubbed module is: subclassable, never callable."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"IMPORT STUB: {type(self).__qualname__} is a placeholder for a GPU-only package")

    def __init_subclass__(cls, **kwargs):  # OpenRLHF subclasses a few of them at import time
        super().__init_subclass__()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "__version__" or name == "version":
            return "0.0.0+import-stub"
        placeholder = type(name, (_Placeholder,), {"__module__": self.__name__, "__qualname__": f"{self.__name__}.{name}"})
        setattr(self, name, placeholder)
        return placeholder


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == name or fullname.startswith(name + ".") for name in ABSENT):
            raise ModuleNotFoundError(f"IMPORT STUB: {fullname} is absent (an optional GPU kernel)", name=fullname)
        if any(fullname == name or fullname.startswith(name + ".") for name in STUBBED):  # a package or one submodule
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so submodules resolve through this finder too
        module.__version__ = "0.0.0+import-stub"
        module.IMPORT_STUB = True
        return module

    def exec_module(self, module):
        return None


_FINDER = _StubFinder()


def install() -> None:
    """Make vllm/deepspeed/flash_attn importable as placeholders (before any real finder)."""
    for name in STUBBED:
        try:  # never shadow a real installation
            spec = importlib.machinery.PathFinder.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and name not in sys.modules:
            raise RuntimeError(f"{name} is really installed here; the import stub must not shadow it")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


#: The modules loaded once gem-core's setup hook has run in this process (set by install_then_arm).
HOOK_MODULES: frozenset[str] = frozenset()


def install_then_arm() -> None:
    """Ray ``worker_process_setup_hook`` for the Ray test: the stubs, then gem-core's own hook
    (``gem_integrations.openrlhf.plugin_spec.setup_worker``); records what was imported by then."""
    global HOOK_MODULES
    install()
    from gem_integrations.openrlhf.plugin_spec import setup_worker

    setup_worker()
    HOOK_MODULES = frozenset(sys.modules)
