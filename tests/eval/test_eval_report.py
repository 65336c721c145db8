"""gem-core eval report, the summary maths, the command line's errors and the progress bar."""

from __future__ import annotations

import io
import sys

import pytest
from eval_support import EASY, HARD

from gem_core.cli import main
from gem_core.eval.summary import wilson_interval


def test_wilson_interval_known_values():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)
    assert wilson_interval(50, 100) == pytest.approx((0.4038, 0.5962), abs=5e-5)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


@pytest.fixture
def two_runs(tmp_path):
    paths = []
    for policy in ("oracle", "random"):
        path = tmp_path / f"{policy}.jsonl"
        assert main(["eval", EASY, HARD, "--policy", policy, "--episodes", "40", "--out", str(path)]) == 0
        paths.append(path)
    return paths


def test_two_results_files_render_into_one_report_with_a_chart(two_runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    capsys.readouterr()
    report, chart = tmp_path / "out" / "report.md", tmp_path / "out" / "chart.png"
    report.parent.mkdir()
    assert main(["eval", "report", *map(str, two_runs), "--out", str(report), "--plot", str(chart)]) == 0
    text = report.read_text()
    assert "| oracle |" in text and "| random |" in text and "![success rate by env and run](chart.png)" in text
    comparison = text.split("## Success rate")[1].split("## ")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in comparison.splitlines() if line.startswith("| game:")}
    assert list(rows) == [EASY, HARD]
    assert rows[EASY].split(" | ")[1].startswith("1.000 [0.912, 1.000] (n=40)")  # oracle column
    random_easy = [line for line in open(two_runs[1]) if EASY + '"' in line]
    wins = sum('"success": true' in line for line in random_easy)
    assert rows[EASY].split(" | ")[2].startswith(f"{wins / 40:.3f} [")  # random column
    assert text.count("## ") == 3  # the comparison, then one section per run
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000
    assert f"report: {report}" in capsys.readouterr().out


def test_the_report_prints_when_no_file_is_given(two_runs, capsys):
    capsys.readouterr()
    assert main(["eval", "report", str(two_runs[0])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# gem-core eval report") and "| all | 80 | 1.000 |" in out


def test_plot_without_matplotlib_is_one_line(two_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    capsys.readouterr()
    report = tmp_path / "r.md"
    assert main(["eval", "report", *map(str, two_runs), "--out", str(report), "--plot", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plot needs matplotlib" in err and not report.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", EASY, "--episodes", "0", "--policy", "oracle"], "--episodes"),
        (["eval", EASY, "--policy", "nope"], "--policy"),
        (["eval", EASY, "--request-timeout", "-1"], "--request-timeout"),
        (["eval", "eval:NoSuchSet*", "--policy", "oracle"], "no registered env id matches 'eval:NoSuchSet*'"),
        (["eval", "game:GuessTheNumbr-v0", "--policy", "oracle"], "GuessTheNumber"),
        (["eval", EASY, "--policy", "oracle", "--resume"], "--resume needs --out FILE"),
        (["eval", EASY, "--policy", "oracle", "--model", "x"], "drop --model"),
        (["eval", EASY, "--policy", "oracle", "--tools", "shell"], "unknown env tool"),
        (["eval", EASY, "--policy", "oracle", "--env-kwargs", "{nope"], "--env-kwargs"),
        (["eval", EASY, "--policy", "openai", "--model", "m"], "--base-url"),
        (["eval", EASY, "--policy", "openai", "--base-url", "http://127.0.0.1:9/v1"], "--model"),
        (["eval", EASY, "--policy", "hf"], "--model PATH"),
        (["eval", "report", "/no/such/file.jsonl"], "No such file"),
        (["eval"], "required"),
    ],
)
def test_usage_errors_are_one_line_exit_2_no_traceback(argv, message, capsys, monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err.strip().splitlines()[-1], err


def test_the_endpoint_comes_from_the_environment(monkeypatch, capsys):
    from eval_support import binary_search

    from gem_core.testing import FakeChatServer

    with FakeChatServer(binary_search) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_MODEL", "from-env")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        assert main(["eval", EASY, "--episodes", "2"]) == 0
        bodies = [r["body"]["model"] for r in server.requests]
    assert set(bodies) == {"from-env"} and "with from-env" in capsys.readouterr().out


def test_the_progress_bar_shows_the_running_success_rate(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["eval", EASY, "--policy", "oracle", "--episodes", "12"]) == 0
    shown = terminal.getvalue()
    assert "12/12" in shown and "success 1.000 (12/12)" in shown
