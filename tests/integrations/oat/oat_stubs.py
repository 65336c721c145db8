"""IMPORT STUB: deepspeed, vllm, launchpad and pyarrow.plasma, so that oat's own CPU code runs.

vllm is stubbed only where it is not installed (the `oat` session); the `oat_real` session has the real one.

oat-llm 0.2.4 imports these GPU-only (or removed: plasma left pyarrow in 12.0) modules at module level
(``oat.utils.deepspeed``, ``oat.actors.base``, ``oat.utils.ipc``, ``oat.learners.base``). None of the
code under test calls into them. They are placeholder modules made by the OpenRLHF tests' stub machinery
(``tests/integrations/openrlhf/openrlhf_import_stubs.py``, loaded here as its own module object): any
attribute is a class that raises if called. Everything else (oat, torch, transformers, datasets,
pyarrow itself) is the real installed package. Imported by this folder's conftest and by the worker
processes of the two-device test.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
STUBBED = ("deepspeed", "launchpad", "pyarrow.plasma") + (() if _VLLM_INSTALLED else ("vllm",))  # IMPORT STUB: GPU-only modules


def install() -> None:
    if "oat_import_stubs" in sys.modules:
        return
    path = os.path.join(os.path.dirname(__file__), "..", "openrlhf", "openrlhf_import_stubs.py")
    spec = importlib.util.spec_from_file_location("oat_import_stubs", path)
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    stubs.STUBBED = STUBBED
    stubs.install()
    sys.modules["oat_import_stubs"] = stubs


install()
