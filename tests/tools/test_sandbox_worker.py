"""The sandbox worker's own invariants, checked on the worker module in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gem_core.tools.sandbox as sandbox_package

WORKER = Path(sandbox_package.__file__).with_name("worker.py")


def test_a_child_is_not_forked_when_its_pipes_would_land_on_the_descriptors_it_dup2s_onto(tmp_path):
    # The child puts its pipe ends on 1-4 with dup2; a pipe end already on one of those would be closed
    # by another dup2. main() keeps 0-4 taken; a process that does not (here fd 3 is free) must refuse.
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.argv = ["worker", {json.dumps(json.dumps({"sandboxed": False, "tmp_root": str(tmp_path)}))}]
        spec = importlib.util.spec_from_file_location("worker", {str(WORKER)!r})
        worker = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(worker)
        try:
            worker.fork_child()
        except OSError as exc:
            print(exc)
        else:
            print("forked")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "a pipe landed on fd 3: descriptors 0-4 must stay taken"
