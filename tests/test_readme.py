"""The README and the docs pages, run as a new user would: their shell and Python blocks, and every
command, env id, extra, nox session and link they name.

The pages are :data:`PAGES`: README.md, then every ``docs/*.md`` but DESIGN.md, by name (the design notes,
:data:`LINKED_ONLY`, have their links checked, nothing else). Every page gets the same rules:

- Python blocks run whole, each in a fresh interpreter, as a script under the ``if __name__ ==
  "__main__":`` guard the README asks for (async vector envs start workers with "spawn").
- Shell commands run whole through the installed ``gem-core`` script, in a temporary directory, a block's
  commands in order; a ``text`` block right after a shell block must show what those commands printed or
  wrote. Dataset commands run with at most :data:`MAX_ROWS` rows. Every block runs on its own (a fresh
  directory, a fresh interpreter): no block depends on what an earlier one made.
- Blocks and commands that install packages, train (``gem-core train``: its options parse), or need a GPU, a network or a trainer this virtualenv
  lacks are marked ``readme_slow`` and checked without running them whole: the extras and versions they
  name exist in pyproject.toml, their flags are ones the command takes, their settings are those of the
  example scripts that the plugin tests validate, the names they import exist.
- Every ``gem-core ...`` in inline code parses with gem-core's own parser (nothing runs); every env id
  a page names is registered (or the page says where it comes from); every ``pip install -e
  ".[extra]"`` names an extra of pyproject.toml; every ``nox -s`` names a session of the noxfile.
- Every relative link (outside code) points at a file of the repository, and a ``#anchor`` at a heading
  of that markdown file (GitHub's anchors); the README links every docs page; the benchmark tables of
  docs/benchmarks.md are the README's, verbatim.

A command a page gains that no rule below knows fails the test: add a rule for it.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import gem_core
from gem_core.experiment import FIELD_OF

ROOT = Path(__file__).resolve().parents[1]
# README.md first, then the docs pages by name; DESIGN.md (design notes, no commands): its links only
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "DESIGN.md"))
LINKED_ONLY = ("docs/DESIGN.md",)


@cache
def page_text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


README = page_text("README.md")
MAX_ROWS = 64  # `make-dataset --n` in a page is run with at most this many rows
SHELLS = ("bash", "sh", "shell", "console")


FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    line: int  # of the opening fence
    end: int  # of the closing fence
    text: str


@cache
def blocks(page: str) -> tuple[Block, ...]:
    text = page_text(page)
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, match.group(1), line, text.count("\n", 0, match.end()) + 1, match.group(2)))
    return tuple(found)


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join(self.words)


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: continuation lines joined, comments dropped, ``&&`` split."""
    found = []
    joined = block.text.replace("\\\n", " ")
    for offset, line in enumerate(joined.split("\n")):
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            found.append(Command(block.page, block.line + 1 + offset, tuple(words[:cut])))
            words = words[cut + 1 :]
    return found


SHELL_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang in SHELLS]
PYTHON_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang == "python"]


def _script() -> list[str]:
    script = Path(sys.executable).with_name("gem-core")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gem_core.cli"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def gem_core_cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_script(), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


# -- what pyproject.toml and the noxfile offer ------------------------------------------------------------


@cache
def extras() -> dict[str, list[str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"]


@cache
def nox_sessions() -> tuple[str, ...]:
    done = subprocess.run([sys.executable, "-m", "nox", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(m.group(1) for m in re.finditer(r"^[*-] (\S+) ->", done.stdout, flags=re.M))


def session_exists(name: str) -> bool:
    return any(session == name or session.startswith(name + "-") for session in nox_sessions())


def pip_install_spec_ok(spec: str) -> None:
    """``.``, ``.[a,b]``: the clone itself, with extras pyproject.toml declares."""
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", spec)
    assert match, f"pip install -e {spec}: install the clone ('.'), the package is not on PyPI"
    for extra in filter(None, (match.group(1) or "").split(",")):
        assert extra in extras(), f"pip install -e {spec}: pyproject.toml has no extra {extra!r} (it has {sorted(extras())})"


# -- the rules: how each kind of shell command is checked ------------------------------------------------
# Each returns True when it ran the command whole, False when it checked it without running it (slow).


def check_git_clone(command: Command, cwd: Path, outputs: list[str]) -> bool:
    assert len(command.words) == 4 and command.words[3] == "gem-core", command
    assert (ROOT / ".git").exists() and 'name = "gem-core"' in (ROOT / "pyproject.toml").read_text()
    return False  # network


def check_cd(command: Command, cwd: Path, outputs: list[str]) -> bool:
    assert command.words[1:] == ("gem-core",), f"{command}: the clone's directory"
    return True


def check_venv(command: Command, cwd: Path, outputs: list[str]) -> bool:
    assert command.words[:3] == ("python", "-m", "venv") and len(command.words) == 4, command
    assert importlib.util.find_spec("venv") is not None
    return False  # installs pip into a new environment (seconds); the README's `.venv` is checked by `.`


def check_activate(command: Command, cwd: Path, outputs: list[str]) -> bool:
    assert command.words[1:] == (".venv/bin/activate",), command
    return True


def check_pip_install(command: Command, cwd: Path, outputs: list[str]) -> bool:
    words = list(command.words[2:])
    if words[0] == "-e":
        assert len(words) == 2, command
        pip_install_spec_ok(words[1])
        return False
    # pip install torch==V --extra-index-url https://download.pytorch.org/whl/cpu: the pinned version, CPU build (an
    # extra index: torch's dependencies still come from the usual one, which is all an offline mirror has)
    assert re.fullmatch(r"torch==[\w.]+", words[0]) and words[1:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"], command
    pins = {dep for name in ("torch", "train") for dep in extras()[name] if dep.startswith("torch")}
    assert pins == {words[0]}, f"{command}: the extras pin {pins}"
    return False


def nox_posargs_ok(words: list[str] | tuple[str, ...], where: str) -> list[str]:
    """The sessions of ``nox -s SESSION... [-- PYTEST ARGS]`` (``words`` after ``-s``); pytest's ``-m`` in the
    arguments after ``--`` names only markers pyproject.toml registers."""
    words = list(words)
    if "--" not in words:
        return words
    sessions, posargs = words[: words.index("--")], words[words.index("--") + 1 :]
    if "-m" in posargs:
        expression = posargs[posargs.index("-m") + 1].strip("\"'")
        markers = (ROOT / "pyproject.toml").read_text().split("\nmarkers = [", 1)[1].split("\n]", 1)[0]
        registered = set(re.findall(r'^\s*"(\w+):', markers, re.M))
        named = set(re.findall(r"\w+", expression)) - {"not", "and", "or"}
        assert named <= registered, f"{where}: -m {expression}: no marker {sorted(named - registered)} in pyproject.toml"
    return sessions


def check_nox(command: Command, cwd: Path, outputs: list[str]) -> bool:
    assert command.words[0] == "nox"
    sessions = nox_posargs_ok(command.words[2:], str(command)) if command.words[1:2] == ("-s",) else ()
    assert not command.words[1:] or sessions, command
    for session in sessions:
        assert session_exists(session), f"{command}: no nox session {session!r} in {nox_sessions()}"
    assert {"core", "core_py-3.10", "core_py-3.12"} <= set(nox_sessions())
    return False  # every test session: far too long to run inside one


def check_gem_core(command: Command, cwd: Path, outputs: list[str]) -> bool:
    args = list(command.words[1:])
    if args[:2] == ["openrlhf", "train"]:
        return check_openrlhf_train(args[2:], cwd)
    if args[0] == "make-dataset":
        return check_make_dataset(args, cwd, outputs)
    if args[0] == "experiment" and len(args) > 1 and (ROOT / args[1]).is_file():
        args[1] = str(ROOT / args[1])  # a shipped experiment file, read from the clone; what it writes lands in cwd
    if args[0] == "train":
        # a training run (minutes to hours, some on a GPU or a hub model): its options parse, nothing runs
        assert parses(args) is None, f"{command}: {parses(args)}"
        return False
    done = gem_core_cli(args, cwd)
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
    outputs.append(done.stdout)
    if args[0] == "play" and "--episodes" in args:
        episodes = args[args.index("--episodes") + 1]
        assert re.search(rf"^  episodes +{episodes}$", done.stdout, flags=re.M), done.stdout
    return True


def check_make_dataset(args: list[str], cwd: Path, outputs: list[str]) -> bool:
    if "--n" in args:
        at = args.index("--n") + 1
        args[at] = str(min(int(args[at]), MAX_ROWS))
    needs = {"verl": "pyarrow", "trl": "datasets"}.get(args[1])
    done = gem_core_cli(args, cwd)
    assert "Traceback" not in done.stderr, done.stderr
    if needs is not None and importlib.util.find_spec(needs) is None and done.returncode != 0:
        # what a user without the trainer's extra meets: one line naming the extra
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and f".[{args[1]}]" in done.stderr, done.stderr
        assert parses(["make-dataset", *args[1:]]) is None
        return False
    assert done.returncode == 0, done.stderr
    out = Path(cwd, args[args.index("--out") + 1])
    assert out.exists() and out.stat().st_size > 0
    outputs.append(done.stdout)
    return True


def check_openrlhf_train(args: list[str], cwd: Path) -> bool:
    """The launcher needs OpenRLHF and GPUs: its agent path resolves, and every flag is one the launcher
    or OpenRLHF takes (its --help lists them; without OpenRLHF, the ones gem-core adds)."""
    path = gem_core_cli(["openrlhf", "agent-path"], cwd)
    assert path.returncode == 0 and Path(path.stdout.strip()).is_file(), path.stderr
    flags = [a for a in args if a.startswith("--")]
    assert "--train.agent_func_path" in flags and args[args.index("--train.agent_func_path") + 1] == "$(gem-core openrlhf agent-path)"
    if importlib.util.find_spec("openrlhf") is None:
        shown = gem_core_cli(["openrlhf", "train", "--help"], cwd)
        assert shown.returncode == 0, shown.stderr
        for flag in flags:
            assert flag in shown.stdout, f"gem-core openrlhf train --help does not show {flag}"
    return False


def check_verl_main(command: Command, cwd: Path, outputs: list[str]) -> bool:
    """verl's trainer needs GPUs: each override is one the example script sets (the verl tests compose
    that script's overrides with hydra and run verl's validate_config on them)."""
    script = (ROOT / "examples/verl/run_gem_sudoku.sh").read_text()
    overrides = [w for w in command.words[3:] if w != "..."]
    assert overrides, command
    for override in overrides:
        key, _, value = override.partition("=")
        assert re.search(rf"^\s*{re.escape(key)}=", script, flags=re.M), f"{override}: not in examples/verl/run_gem_sudoku.sh"
        if key != "data.train_files":
            assert re.search(rf"^\s*{re.escape(override)}\s*\\?$", script, flags=re.M), f"{override}: the example sets another value"
    return False


def check_benchmark(command: Command, cwd: Path, outputs: list[str]) -> bool:
    """``python benchmarks/NAME.py [options]``: the repository's benchmark, every option given is in its
    ``--help``, each ``--python NAME=PATH`` a nox session's virtualenv and each ``--set`` an experiment key (a
    benchmark runs for long: its arms are tested by tests/train/test_cross_framework.py and the real tiers)."""
    script = command.words[1]
    assert (ROOT / script).is_file(), f"{command}: no {script}"
    shown = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    words = list(command.words[2:])
    noxfile = (ROOT / "noxfile.py").read_text()
    for index, word in enumerate(words):
        if word.startswith("--"):
            assert word in shown.stdout, f"{script} --help does not show {word}"
        if word == "--python":
            session = re.fullmatch(r"\w+=\.nox/(\w+)/bin/python", words[index + 1])
            assert session and f"def {session.group(1)}(" in noxfile, f"{words[index + 1]}: not a nox session's virtualenv"
        if word == "--set":
            assert words[index + 1].partition("=")[0] in FIELD_OF, f"--set {words[index + 1]}: not an experiment key"
    return False


def check_python_m(command: Command, cwd: Path, outputs: list[str]) -> bool:
    if command.words[1].startswith("benchmarks/"):
        return check_benchmark(command, cwd, outputs)
    if command.words[2].startswith("verl."):
        return check_verl_main(command, cwd, outputs)
    if command.words[2] == "venv":
        return check_venv(command, cwd, outputs)
    raise AssertionError(f"{command}: no rule for this module in tests/test_readme.py")


def check_bash_script(command: Command, cwd: Path, outputs: list[str]) -> bool:
    """``bash scripts/train.sh [options]``: the script is the repository's and parses; what follows it are
    ``gem-core train`` options (tests/train/test_train_script.py runs it whole)."""
    assert command.words[1] == "scripts/train.sh", f"{command}: no rule for this script in tests/test_readme.py"
    script = ROOT / command.words[1]
    assert script.is_file() and subprocess.run(["bash", "-n", str(script)]).returncode == 0, command
    assert parses(["train", *command.words[2:]]) is None, f"{command}: {parses(['train', *command.words[2:]])}"
    return False  # makes a virtualenv and trains for minutes


RULES = {
    "bash": check_bash_script,
    "git": check_git_clone,
    "cd": check_cd,
    ".": check_activate,
    "pip": check_pip_install,
    "nox": check_nox,
    "gem-core": check_gem_core,
    "python": check_python_m,
}


def _block_id(block: Block) -> str:
    return f"{block.page}:line{block.line}"


def _is_slow(block: Block) -> bool:
    return any(
        c.words[0] in ("git", "pip", "nox", "bash")
        or c.words[:2] == ("python", "-m")
        or c.words[1:3] == ("openrlhf", "train")
        or c.words[:2] == ("gem-core", "train")
        for c in commands(block)
    )


def _text_after(block: Block) -> list[Block]:
    """The ``text`` blocks that follow ``block`` on its page before the next code block: its output, shown."""
    later = [b for b in blocks(block.page) if b.line > block.end]
    shown = []
    for b in later:
        if b.lang != "text":
            break
        shown.append(b)
    return shown


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=_block_id(b), marks=[pytest.mark.readme_slow] if _is_slow(b) else []) for b in SHELL_BLOCKS],
)
def test_shell_block(block: Block, tmp_path: Path) -> None:
    outputs: list[str] = []
    cwd = tmp_path / "gem-core"
    cwd.mkdir()
    for command in commands(block):
        rule = RULES.get(command.words[0])
        assert rule is not None, f"{command.page} line {command.line}: no rule for {command} in tests/test_readme.py"
        rule(command, cwd, outputs)
    written = [p.read_text(errors="replace") for p in cwd.rglob("*") if p.is_file() and p.stat().st_size < 1_000_000]
    seen = {line.rstrip() for text in outputs + written for line in text.splitlines()}
    for shown in _text_after(block):
        for line in shown.text.splitlines():
            assert not line.strip() or line.rstrip() in seen, f"{shown.page} line {shown.line}: {line!r} is not what the commands above print or write"


# -- Python blocks ------------------------------------------------------------------------------------------


def _placeholders(source: str) -> bool:
    """A block with ``...`` standing for arguments the reader fills in (it does not compile)."""
    try:
        ast.parse(source)
    except SyntaxError:
        return "..." in source
    return False


def _imports(source: str) -> list[tuple[str, list[str]]]:
    found = []
    for line in source.splitlines():
        match = re.match(r"from ([\w.]+) import (.+)$", line.strip())
        if match:
            found.append((match.group(1), [n.strip() for n in match.group(2).split(",")]))
        match = re.match(r"import ([\w.]+)$", line.strip())
        if match:
            found.append((match.group(1), []))
    return found


def _is_trainer_block(block: Block) -> bool:
    return _placeholders(block.text) or any(importlib.util.find_spec(module.split(".")[0]) is None for module, _ in _imports(block.text))


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=_block_id(b), marks=[pytest.mark.readme_slow] if _is_trainer_block(b) else []) for b in PYTHON_BLOCKS],
)
def test_python_block(block: Block, tmp_path: Path) -> None:
    if _is_trainer_block(block):
        # a trainer's example (its model, its config, `...` to fill in): the names it imports exist
        for module, names in _imports(block.text):
            top = module.split(".")[0]
            if top not in ("gem_core", "gem_integrations"):
                continue
            imported = __import__(module, fromlist=["_"])
            public = set(getattr(imported, "__all__", ())) | set(vars(imported))
            for name in names:
                assert name in public, f"{block.page} line {block.line}: {module} has no {name}"
        return
    script = tmp_path / "readme_block.py"
    script.write_text('if __name__ == "__main__":\n' + textwrap.indent(block.text, "    "))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{block.page} line {block.line}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr


# -- inline commands, ids, extras, sessions ------------------------------------------------------------------

INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)")
INLINE = [(page, m.group(1)) for page in PAGES for m in INLINE_CODE.finditer(page_text(page))]
PLACEHOLDERS = {"ENV_ID...": "game:GuessTheNumber-v0-easy", "ENV_ID": "game:GuessTheNumber-v0-easy", "ID": "game:GuessTheNumber-v0-easy", "N": "2"}


def parses(argv: list[str]) -> str | None:
    """None when gem-core's parser takes ``argv`` (or only misses required arguments, when a page
    just names a command), else argparse's error line."""
    from gem_core import cli
    from gem_core.eval.cli import with_default_action

    parser = cli.build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(with_default_action(argv))
        except SystemExit as exit_:
            if exit_.code == 0:
                return None
            line = err.getvalue().strip().splitlines()[-1]
            return None if "the following arguments are required" in line else line
    return None


INLINE_COMMANDS = sorted({(page, " ".join(code.split())) for page, code in INLINE if code.startswith("gem-core ")}, key=lambda pc: (PAGES.index(pc[0]), pc[1]))


@pytest.mark.parametrize("code", [pytest.param(code, id=f"{page}:{code}") for page, code in INLINE_COMMANDS])
def test_inline_gem_core_command_parses(code: str) -> None:
    argv = [PLACEHOLDERS.get(word, word) for word in shlex.split(code)[1:]]
    if argv[:2] == ["openrlhf", "train"]:
        assert argv[2:] in ([], ["--help"]), code  # its options are OpenRLHF's: see the shell block's rule
        return
    assert parses(argv) is None, f"`{code}`: {parses(argv)}"


@pytest.mark.parametrize("page", PAGES)
def test_inline_pip_nox_and_python_m_name_what_exists(page: str) -> None:
    for code in (code for in_page, code in INLINE if in_page == page):
        words = code.split()
        if words[:3] == ["pip", "install", "-e"]:
            pip_install_spec_ok(words[3].strip("\"'"))
        elif words[:2] == ["nox", "-s"]:
            for session in nox_posargs_ok(words[2:], f"{page}: `{code}`"):
                assert session_exists(session), f"{page}: `{code}`: no nox session {session!r}"
        elif words[:2] == ["python", "-m"] and words[2].startswith(("gem_core", "gem_integrations")):
            assert importlib.util.find_spec(words[2]) is not None, f"{page}: {code}"
    for extra in re.findall(r"pip install -e \"?\.\[([\w,-]+)\]", page_text(page)):
        pip_install_spec_ok(f".[{extra}]")


ID = re.compile(r"(?<![\w/.:-])([a-z][a-z0-9_]*):([A-Z][\w]*(?:-[\w*?]+)*|\*|[A-Z][\w]*-\*)")
NOT_IDS = {"category:Name-vN"}  # a description of the id format


@pytest.mark.parametrize("page", PAGES)
def test_every_env_id_a_page_names_is_registered(page: str) -> None:
    text = page_text(page)
    registered = gem_core.list_envs()
    named = sorted({m.group(0) for m in ID.finditer(text)} - NOT_IDS)
    if page == "README.md":
        assert "game:Sudoku-v0-easy" in named and "bench:CpuBound-v0" in named  # the pattern finds them
    for env_id in named:
        if env_id == "bench:CpuBound-v0":  # the benchmark's own env: the page says so and where
            assert 'register("bench:CpuBound-v0"' in (ROOT / "benchmarks/env_throughput.py").read_text()
            assert "`gem-core list` does not show it" in text, f"{page} names bench:CpuBound-v0 without saying it is the benchmark's own"
        elif any(c in env_id for c in "*?["):
            if not fnmatch.filter(registered, env_id):
                assert env_id == "eval:*" and "registers none yet" in text, f"{page}: {env_id} matches no registered id"
        else:
            gem_core.spec(env_id)  # raises UnknownEnvError with a suggestion


GAMES = re.compile(r"The (\d+) games \(([^)]*)\) each have\s+`-v0-easy`, `-v0-hard`, `-v0-random`")


def test_the_games_the_docs_list_have_the_variants_they_name() -> None:
    found = [(page, match) for page in PAGES for match in GAMES.finditer(page_text(page))]
    assert found, "the docs' list of games moved: update this test"
    for page, match in found:
        games = [g.strip() for g in match.group(2).replace("\n", " ").split(",")]
        assert len(games) == int(match.group(1)), page
        for game in games:
            for variant in ("-v0", "-v0-easy", "-v0-hard", "-v0-random"):
                gem_core.spec(f"game:{game}{variant}")
        listed = {env_id.split(":")[1].split("-")[0] for env_id in gem_core.list_envs("game")}
        assert listed == set(games), f"gem-core list has games {page} does not name, or the reverse: {listed ^ set(games)}"


# -- links ---------------------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target), an optional title


def _prose(text: str) -> str:
    """``text`` without its code: fenced blocks and inline code spans blanked, line numbers kept."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(lambda m: "``" + "\n" * m.group(0).count("\n"), text)


def links(page: str) -> list[tuple[int, str]]:
    """(line, target) of every link outside code on ``page``."""
    prose = _prose(page_text(page))
    return [(prose.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(prose)]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a markdown file's headings (outside code; a repeated one gets -1, -2, ... as on GitHub)."""
    counts: dict[str, int] = {}
    found = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", FENCE.sub("", path.read_text(encoding="utf-8")), flags=re.M):
        anchor = github_anchor(match.group(1))
        found.add(anchor if anchor not in counts else f"{anchor}-{counts[anchor]}")
        counts[anchor] = counts.get(anchor, 0) + 1
    return frozenset(found)


@pytest.mark.parametrize("page", [*PAGES, *LINKED_ONLY])
def test_relative_links_point_at_files_and_headings_that_exist(page: str) -> None:
    source = (ROOT / page).resolve()
    for line, target in links(page):
        if re.match(r"[A-Za-z][\w+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{page} line {line}: links {target}, which is not in the repository"
        if anchor:
            assert resolved.suffix == ".md", f"{page} line {line}: {target}: an anchor into a file that is not markdown"
            assert anchor in anchors(resolved), f"{page} line {line}: {target}: {resolved.relative_to(ROOT)} has no heading #{anchor}"


def test_the_readme_links_every_docs_page() -> None:
    assert (ROOT / "docs/DESIGN.md").exists() and "(docs/DESIGN.md)" in README
    linked = {target.partition("#")[0] for _, target in links("README.md")}
    for page in [*PAGES[1:], *LINKED_ONLY]:
        assert page in linked, f"the README does not link {page}"
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs == set(PAGES[1:]) | set(LINKED_ONLY), docs


def _tables(text: str) -> list[str]:
    """The markdown tables of ``text`` (runs of lines starting with ``|``), outside code."""
    return [m.group(0).rstrip("\n") for m in re.finditer(r"^(?:\|.*\n?)+", FENCE.sub("", text), flags=re.M)]


def test_the_benchmark_tables_of_the_docs_are_the_readmes() -> None:
    """docs/benchmarks.md shows the README's benchmark tables again beside how they were measured: the same
    tables, every one, so that the two cannot drift apart."""
    section = re.search(r"^## Benchmarks\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert section, "the README has no Benchmarks section"
    in_readme, in_docs = _tables(section.group(1)), _tables(page_text("docs/benchmarks.md"))
    assert len(in_readme) >= 10 and sorted(in_readme) == sorted(in_docs), set(in_readme) ^ set(in_docs)


def test_every_shell_command_has_a_rule() -> None:
    """No shell command of any page goes unchecked (the shell block tests stop at the first failure)."""
    for block in SHELL_BLOCKS:
        for command in commands(block):
            assert command.words[0] in RULES, f"{command.page} line {command.line}: no rule for {command}"


@pytest.mark.readme_slow
@pytest.mark.skipif(os.environ.get("GEM_README_FULL") != "1", reason="installs into a new virtualenv (minutes, a package index): GEM_README_FULL=1 runs it")
def test_the_install_block_on_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The README's install block, whole, in a new virtualenv (the clone is this checkout), then the
    main job and `gem-core list` from that virtualenv."""
    install = next(b for b in SHELL_BLOCKS if b.page == "README.md" and any(c.words[:1] == ("git",) for c in commands(b)))
    venv = tmp_path / ".venv"
    for command in commands(install):
        if command.words[0] in ("git", "cd", "."):
            continue  # the clone is this checkout; the venv's own executables are called below
        words = list(command.words)
        if words[:3] == ["python", "-m", "venv"]:
            words = [sys.executable, "-m", "venv", str(venv)]
        elif words[:2] == ["pip", "install"]:
            words = [str(venv / "bin/pip"), "install", *[w.replace(".", str(ROOT), 1) if w.startswith(".") else w for w in words[2:]]]
        done = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    listed = subprocess.run([str(venv / "bin/gem-core"), "list"], capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "game:Sudoku-v0-easy" in listed.stdout, listed.stderr
    play = next(c for b in SHELL_BLOCKS if b.page == "README.md" for c in commands(b) if c.words[:2] == ("gem-core", "play"))
    done = subprocess.run([str(venv / "bin/gem-core"), *play.words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "success rate" in done.stdout, done.stderr


def test_a_nox_command_s_pytest_arguments_are_read_and_an_unknown_marker_fails() -> None:
    """`nox -s A B -- -m EXPR`: the sessions are the words before `--`; EXPR names registered markers only."""
    assert nox_posargs_ok(["verl_real", "rl2_real", "--", "-m", "benchmark_arm"], "here") == ["verl_real", "rl2_real"]
    assert nox_posargs_ok(["core", "--", "-m", "not slow and not benchmark_arm"], "here") == ["core"]
    with pytest.raises(AssertionError, match=r"no marker \['benchmark_arms'\]"):
        nox_posargs_ok(["verl_real", "--", "-m", "benchmark_arms"], "here")
