"""benchmarks/rollout_cache.py on the tiny model: every arm timed and tabled, the first the 1.00x baseline, the
arms that batch in rounds identical over their repeats, and the last arm generating with the trainer's bfloat16
copy (its forward counted on that copy: a count of zero tokens would mean the arm ran another model)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.scripts import script_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with script_module(ROOT / "benchmarks" / "rollout_cache.py") as module:
        yield module


def _row(out: str, arm: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(f"| {arm} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_every_arm_is_timed_and_tabled(bench, capsys, tmp_path):
    assert bench.main(["--model", "tiny", "--repeats", "2", "--warmup-steps", "0", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    names = [name for name, _ in bench.ARMS]
    assert len(names) == 4 and names[-1].endswith("bfloat16 copy (default)")
    first = _row(out, names[0])
    assert first[-1] == "1.00x"
    for name in names[1:]:
        cells = _row(out, name)
        assert cells[5] == "yes", f"{name}: rounds must repeat identically"
        prefill, decode = (int(x) for x in cells[4].split(" / "))
        assert prefill > 0 and decode > 0 and int(cells[3]) >= 32


def test_bad_arguments_are_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err
