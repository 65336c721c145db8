"""benchmarks/same_update.py (Tier 1) answers bad input with one line and exit status 2, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import same_update  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--python", "trl"], "expected TRAINER=PATH"),
        (["--python", "nope=/usr/bin/python3"], "expected TRAINER=PATH with TRAINER one of trl, openrlhf"),
        (["--trainers", "nope"], "invalid choice"),
        (["--experiment", "/no/such/file.toml"], "/no/such/file.toml: no such experiment file"),
    ],
)
def test_bad_input_is_one_line(argv, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        same_update.main([*argv, "--out", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
