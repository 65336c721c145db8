"""gem_core.precision: ``auto`` is $GEM_PRECISION where set (bf16 or float32, anything else one line naming it),
else the device's rule."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gem_core import precision


def test_gem_precision_decides_auto_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    monkeypatch.delenv(precision.ENV, raising=False)
    assert precision.auto_precision("cpu") == "float32"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.auto_precision("cpu") == "bf16"
    monkeypatch.setenv(precision.ENV, "float32")
    assert precision.auto_precision("cpu") == "float32"
    monkeypatch.setenv(precision.ENV, "fp16")
    with pytest.raises(ValueError, match="GEM_PRECISION must be bf16 or float32, got 'fp16'"):
        precision.auto_precision("cpu")
    done = subprocess.run([sys.executable, "-m", "gem_core.precision"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stderr.strip().splitlines() == ["gem_core.precision: GEM_PRECISION must be bf16 or float32, got 'fp16'"]
