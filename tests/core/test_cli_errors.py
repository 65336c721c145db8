"""What a user of the ``gem-core`` command meets on a bad invocation: one line on stderr that names the
argument, the value and what is allowed, exit code 2, no traceback, and nothing written anywhere.

Each row of the table is a command line and the exact last line of stderr. Errors gem-core raises
itself are that one line alone; argparse's own errors come after its usage lines (argparse's
convention, kept). Some rows run the real ``gem-core`` script in a subprocess, as a user would;
the rest call :func:`gem_core.cli.main` in this process. Other CLI error tests live beside the
commands (tests/core/test_cli.py, tests/eval/test_eval_report.py, tests/train/test_trainer.py,
tests/tools/test_search.py); this table holds the rest, the ones issue 26 found among them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

from gem_core import cli

GTN = "game:GuessTheNumber-v0-easy"


def _script() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "gem-core")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "gem_core.cli"]


def run_script(argv: list[str], cwd: str) -> tuple[int, str, str]:
    """The real ``gem-core`` command in a subprocess."""
    done = subprocess.run([*_script(), *argv], capture_output=True, text=True, timeout=120, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# What argparse itself reports (after its usage lines); every other error is gem-core's own, one line alone.
ARGPARSE_ERROR = re.compile(r": error: (argument |unrecognized arguments|the following arguments are required)")


def assert_one_line(code: int, err: str, expected: str) -> None:
    """Exit 2; stderr ends with exactly ``expected``; a gem-core error is that line alone, an argparse
    error is its usage lines then that line."""
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    lines = err.rstrip("\n").split("\n")
    assert lines[-1] == expected, err
    if ARGPARSE_ERROR.search(expected):
        assert lines[0].startswith("usage: gem-core") and all(line.startswith(" ") for line in lines[1:-1]), err
    else:
        assert len(lines) == 1, err


def files_under(path: os.PathLike[str] | str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), path) for root, _dirs, names in os.walk(path) for name in names)


# -- the table -----------------------------------------------------------------------------------------
# (argv, the exact last line of stderr). "{tmp}" is the test's temporary directory (also the cwd).

NO_DIR = "{tmp}/no/such/dir"
TABLE = [
    # the ones issue 26 found
    (["play", GTN, "--seed", "-1", "--policy", "random"], "gem-core play: error: argument --seed: expected a number >= 0, got -1"),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--out", f"{NO_DIR}/x.jsonl"],
        f"gem-core: error: --out {NO_DIR}/x.jsonl: directory {NO_DIR} does not exist (create it first, or name another file)",
    ),
    (
        ["make-dataset", "verl", "--env", GTN, "--n", "2", "--out", f"{NO_DIR}/x.parquet"],
        f"gem-core: error: --out {NO_DIR}/x.parquet: directory {NO_DIR} does not exist (create it first, or name another file)",
    ),
    (
        ["serve-search", "--corpus", "{tmp}/corpus.jsonl", "--port", "99999"],
        "gem-core serve-search: error: argument --port: expected a number in 0..65535, got 99999",
    ),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--max-turns", "-1", "--out", "{tmp}/rows.jsonl"],
        "gem-core make-dataset openrlhf: error: argument --max-turns: expected a number >= 1, got -1",
    ),
    # more bad ids, numbers, flags and files
    (["play", GTN, "--num-envs", "100000000000000"], "gem-core play: error: argument --num-envs: expected a number in 1..1000000, got 100000000000000"),
    (["play", GTN, "--episodes", "many"], "gem-core play: error: argument --episodes: expected a whole number, got 'many'"),
    (["play", GTN, "--vector", "threads"], "gem-core play: error: argument --vector: invalid choice: 'threads' (choose from 'sync', 'async', 'ray')"),
    (["list", "--category"], "gem-core list: error: argument --category: expected one argument"),
    (["list", "--verbose"], "gem-core: error: unrecognized arguments: --verbose"),
    (
        ["serve-search", "--corpus", "{tmp}/corpus.jsonl", "--port", "-1"],
        "gem-core serve-search: error: argument --port: expected a number in 0..65535, got -1",
    ),
    (["serve-search", "--corpus", "{tmp}/corpus.jsonl", "--topk", "0"], "gem-core serve-search: error: argument --topk: expected a number >= 1, got 0"),
    (
        ["serve-search", "--corpus", "{tmp}/corpus.jsonl", "--host", "192.0.2.1", "--port", "0"],  # TEST-NET-1: no machine's address
        "gem-core: error: cannot listen on 192.0.2.1:0: Cannot assign requested address",
    ),
    (
        ["make-dataset", "openrlhf", "--env", "game:GuessTheNumbr-v0", "--n", "2", "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: no env registered as 'game:GuessTheNumbr-v0'. Did you mean: game:GuessTheNumber-v0, game:GuessTheNumber-v0-hard, "
        "game:GuessTheNumber-v0-easy? (`gem-core list` shows every id)",
    ),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--env-kwargs", '{"max_turns": "5"}', "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: game:GuessTheNumber-v0-easy: max_turns='5' is not allowed: expected an integer in 1..100000, or None (set per episode by the game)",
    ),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--env-kwargs", '{"max_turn": 5}', "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: game:GuessTheNumber-v0-easy does not take 'max_turn'. Did you mean: max_turns? It accepts: max_number, max_turns, min_number.",
    ),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--tools", "python,shell", "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: unknown env tool(s) ['shell']; known: python, search",
    ),
    (["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--out", "{tmp}"], "gem-core: error: --out {tmp}: is a directory; name a file to write"),
    (
        ["make-dataset", "rl2", "--env", GTN, "--n", "2", "--run-seed", "3", "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: --run-seed needs --per-update: the start states (groups) of one update",
    ),
    (
        ["make-dataset", "verl", "--env", GTN, "--n", "2", "--run-seed", "3", "--per-update", "2", "--seed-start", "5", "--out", "{tmp}/rows.parquet"],
        "gem-core: error: --run-seed draws the rows' seeds itself: give it without --seed-start or --balanced",
    ),
    (
        ["make-dataset", "trl", "--env", GTN, "--n", "2", "--per-update", "2", "--out", "{tmp}/rows.jsonl"],
        "gem-core: error: --per-update and --seeds-below go with --run-seed",
    ),
    (
        ["make-dataset", "openrlhf", "--env", GTN, "--n", "2", "--max-context-tokens", "0", "--out", "{tmp}/rows.jsonl"],
        "gem-core make-dataset openrlhf: error: argument --max-context-tokens: expected a number >= 1, got 0",
    ),
    (
        ["make-dataset", "verl", "--env", GTN, "--n", "-5", "--out", "{tmp}/x.parquet"],
        "gem-core make-dataset verl: error: argument --n: expected a number >= 1, got -5",
    ),
    (["make-dataset", "trainerx", "--env", GTN], None),  # the choices depend on the plugins installed: checked below
    (
        ["train", "--env-kwargs", '{"max_turns": 2.5}', "--out", "{tmp}/run"],
        "gem-core: error: game:GuessTheNumber-v0-easy: max_turns=2.5 is not allowed: expected an integer in 1..100000, or None (set per episode by the game)",
    ),
    (
        ["train", "--view", "token", "--out", "{tmp}/run"],
        "gem-core train: error: argument --algorithm.view/--view: expected one of 'turn', 'sequence', got 'token'",
    ),
    (
        ["train", "--clip-low", "-0.2", "--out", "{tmp}/run"],
        "gem-core train: error: argument --algorithm.clip_low/--clip-low: expected a number in 0..10, got '-0.2'",
    ),
    (["eval", GTN, "--policy", "random", "--seed-start", "-1"], "gem-core eval run: error: argument --seed-start: expected a number >= 0, got -1"),
    (["eval", GTN, "--policy", "random", "--concurrency", "0"], "gem-core eval run: error: argument --concurrency: expected a number >= 1, got 0"),
    (
        ["eval", GTN, "--policy", "random", "--episodes", "1", "--env-kwargs", '{"max_turns": -1}'],
        "gem-core: error: game:GuessTheNumber-v0-easy: max_turns=-1 is not allowed: expected an integer in 1..100000, or None (set per episode by the game)",
    ),
    (["eval", "report"], "gem-core eval report: error: the following arguments are required: FILE"),
    (
        ["eval", GTN, "--policy", "random", "--episodes", "1", "--out", f"{NO_DIR}/results.jsonl"],
        f"gem-core: error: --out {NO_DIR}/results.jsonl: directory {NO_DIR} does not exist (create it first, or name another file)",
    ),
    (["eval", GTN, "--policy", "random", "--episodes", "1", "--out", "{tmp}"], "gem-core: error: --out {tmp}: is a directory; name a file to write"),
    (
        ["eval", "report", "{tmp}/corpus.jsonl", "--plot", f"{NO_DIR}/chart.png"],
        f"gem-core: error: --plot {NO_DIR}/chart.png: directory {NO_DIR} does not exist (create it first, or name another file)",
    ),
    (["openrlhf", "agent-path", "--extra"], "gem-core: error: unrecognized arguments: --extra"),
    (["--no-such-flag"], "gem-core: error: the following arguments are required: COMMAND"),
]

# Rows run through the real script in a subprocess (the others in this process: faster).
SUBPROCESS = {0, 1, 3, 5, 12, 13, 21}


def _fill(value: str, tmp: str) -> str:
    return value.replace("{tmp}", tmp)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "corpus.jsonl").write_text('{"id": "1", "title": "t", "text": "some words"}\n')
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize("row", range(len(TABLE)), ids=[" ".join(argv)[:70] for argv, _ in TABLE])
def test_bad_invocation_is_one_line_exit_2_and_writes_nothing(row, workdir, capsys, monkeypatch):
    argv, expected = TABLE[row]
    tmp = str(workdir)
    argv = [_fill(arg, tmp) for arg in argv]
    before = files_under(workdir)
    if row in SUBPROCESS:
        code, out, err = run_script(argv, cwd=tmp)
    else:
        code, out, err = run_main(argv, capsys)
    if expected is None:  # make-dataset with an unknown trainer: the installed ones are the choices
        assert code == 2 and "Traceback" not in err
        assert err.rstrip().split("\n")[-1].startswith("gem-core make-dataset: error: argument TRAINER: invalid choice: 'trainerx' (choose from ")
        assert "'openrlhf'" in err and "'verl'" in err
    else:
        assert_one_line(code, err, _fill(expected, tmp))
    assert out == ""
    assert files_under(workdir) == before, "a refused command wrote a file"
    assert not os.path.exists(os.path.join(tmp, "no")), "a refused command made a directory"


# -- the rest of what issue 26 lists -------------------------------------------------------------------


def test_make_dataset_verl_without_pyarrow_names_the_extra(workdir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # find_spec("pyarrow") is None: as if not installed
    code, out, err = run_main(["make-dataset", "verl", "--env", GTN, "--n", "2", "--out", "train.parquet"], capsys)
    assert_one_line(
        code,
        err,
        "gem-core: error: make-dataset verl writes parquet, which needs pyarrow: install the verl extra in the clone "
        "(pip install -e '.[verl]'), or pyarrow alone (pip install 'pyarrow>=19')",
    )
    assert out == "" and not (workdir / "train.parquet").exists()


def test_serve_search_on_a_port_in_use(workdir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_script(["serve-search", "--corpus", "corpus.jsonl", "--port", str(port)], cwd=str(workdir))
    assert_one_line(code, err, f"gem-core: error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert out == ""


@pytest.mark.skipif(importlib.util.find_spec("openrlhf") is not None, reason="OpenRLHF is installed: --help is its own parser's")
def test_openrlhf_train_help_without_openrlhf_shows_the_options(workdir):
    code, out, err = run_script(["openrlhf", "train", "--help"], cwd=str(workdir))
    assert code == 0 and err == "", err
    assert out.startswith("usage: gem-core openrlhf train ")
    for option in (
        "--algo.advantage.estimator rebn",
        "--algo.advantage.rebn_eps",
        "--algo.advantage.rebn_ddof",
        "--train.agent_func_path",
        "--data.label_key label",
    ):
        assert option in out
    assert "pip install -e '.[openrlhf]'" in out
    code, out, err = run_script(["openrlhf", "train", "--algo.advantage.estimator", "rebn"], cwd=str(workdir))
    assert_one_line(code, err, "gem-core: error: OpenRLHF is not installed here: pip install -e '.[openrlhf]' in the clone")


def test_train_with_bad_env_kwargs_writes_no_run_directory(workdir, capsys):
    code, _, err = run_main(["train", "--env-kwargs", '{"max_turns": 0}', "--out", "run", "--no-progress"], capsys)
    assert code == 2 and "max_turns=0 is not allowed" in err
    assert not (workdir / "run").exists()


def test_train_with_a_device_torch_does_not_know(workdir, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    code, _, err = run_main(["train", "--device", "tpu", "--out", "run", "--no-progress"], capsys)
    assert_one_line(code, err, "gem-core: error: --device 'tpu' is not a torch device: expected cpu, cuda, cuda:N or mps")
    assert not (workdir / "run").exists()


def test_train_out_under_a_file_is_one_line(workdir, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    (workdir / "afile").write_text("x")
    code, _, err = run_main(["train", "--out", "afile/run", "--no-progress", "--updates", "1"], capsys)
    assert_one_line(code, err, "gem-core: error: --out afile/run: Not a directory: afile/run")


def test_make_dataset_that_fails_midway_leaves_no_file(workdir, capsys, monkeypatch):
    """The dataset file appears whole or not at all: a row that fails after others were written
    leaves neither a partial file nor the temporary one."""
    from gem_core.tasks import TaskSpec

    calls = {"n": 0}
    original = TaskSpec.first_observation  # each row's first message (first_message reads it too)

    def failing(self, env=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("row 3 cannot be made")
        return original(self, env)

    monkeypatch.setattr(TaskSpec, "first_observation", failing)
    code, _, err = run_main(["make-dataset", "openrlhf", "--env", GTN, "--n", "5", "--out", "rows.jsonl"], capsys)
    assert_one_line(code, err, "gem-core: error: row 3 cannot be made")
    assert files_under(workdir) == ["corpus.jsonl"]


def test_make_dataset_replaces_a_file_whole(workdir, capsys):
    (workdir / "rows.jsonl").write_text("old\n")
    code, out, _ = run_main(["make-dataset", "openrlhf", "--env", GTN, "--n", "3", "--out", "rows.jsonl"], capsys)
    assert code == 0 and out.startswith("wrote 3 prompts to rows.jsonl")
    assert len((workdir / "rows.jsonl").read_text().splitlines()) == 3
    assert files_under(workdir) == ["corpus.jsonl", "rows.jsonl"]
