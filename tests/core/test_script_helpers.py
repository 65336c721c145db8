"""helpers.scripts.script_arguments (tests/helpers/scripts.py): what a written launch script hands its trainer, its other commands run
for real (the arms' CPU drivers of benchmarks/cross_framework.py run the trainer on these arguments their own way)."""

from __future__ import annotations

import pytest

from helpers.scripts import script_arguments


def write(path, body: str):
    path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
    return path


def test_the_trainer_command_is_recorded_not_run_and_the_others_run(tmp_path):
    script = write(
        tmp_path / "run.sh",
        'gem-core --version > "$DATA/version"\n'  # a gem-core command of another kind: run for real
        'gem-core rl2 train "a=1" "b=two words" "$@"\n'
        'echo after > "$DATA/after"\n',
    )
    argv = script_arguments(script, ["rl2", "train"], {"DATA": str(tmp_path)}, ["c=3"], tmp_path / "argv", cwd=tmp_path)
    assert argv == ["a=1", "b=two words", "c=3"]
    assert "gem-core" in (tmp_path / "version").read_text()  # the real CLI ran
    assert (tmp_path / "after").read_text() == "after\n"


def test_another_trainers_command_is_not_taken_for_it(tmp_path):
    script = write(tmp_path / "run.sh", "gem-core openrlhf train --x 1 || true\n")  # the real CLI: not rl2's
    with pytest.raises(RuntimeError, match="never ran `gem-core rl2 train`"):
        script_arguments(script, ["rl2", "train"], {}, [], tmp_path / "argv", cwd=tmp_path)


def test_a_failing_script_is_an_error_with_its_output(tmp_path):
    script = write(tmp_path / "run.sh", 'echo "no such dataset" >&2\nexit 3\n')
    with pytest.raises(RuntimeError, match="no such dataset"):
        script_arguments(script, ["rl2", "train"], {}, [], tmp_path / "argv", cwd=tmp_path)


def test_kept_updates_reads_the_benchmarks_evaluation_points(monkeypatch):
    from gem_core.testing.vllm_cpu_reload import KEEP_ENV, kept_updates

    monkeypatch.delenv(KEEP_ENV, raising=False)
    assert 1 in kept_updates() and 10_000 in kept_updates()  # unset (the tests): every update's checkpoint stays
    monkeypatch.setenv(KEEP_ENV, "10,20,30")
    assert kept_updates() == {10, 20, 30}
    monkeypatch.setenv(KEEP_ENV, "")
    assert kept_updates() == set()  # none listed: none kept
