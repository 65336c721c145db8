"""The RL2 section of the repository's README.md read as the commands a user types (the file itself,
not a copy): the ``gem-core make-dataset rl2 ...`` line and the launcher's hydra overrides from the
``torchrun ... -m gem_integrations.rl2.train ...`` line, with ``$(gem-core ...)`` run through the
gem-core CLI in this process. A test may replace named values (a local model, a CPU-sized batch); a
name that is not in the README's command is an error, so the tests follow the README."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"
LAUNCHER = "gem_integrations.rl2.train"


def rl2_block(readme: Path = README) -> str:
    """The first ```bash block after the README's ``**RL2**`` paragraph."""
    text = readme.read_text()
    start = text.index("**RL2**")
    match = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert match, "README.md: no bash block in the RL2 section"
    return match.group(1)


def commands(block: str, *, commented: bool = False, containing: str = "") -> list[list[str]]:
    """The block's commands (continuation lines joined), each split as a shell would; ``commented``:
    the commands written as comments too (the README shows GPU-only commands as ``# torchrun ...``);
    ``containing``: only the lines with that text (prose comments are not split)."""
    lines = block.splitlines()
    if commented:
        lines = [re.sub(r"^\s*#\s?", "", line) for line in lines]
    else:
        lines = [line for line in lines if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and containing in line]


def _launcher_command(readme: Path) -> list[str]:
    found = commands(rl2_block(readme), commented=True, containing=LAUNCHER)
    assert len(found) == 1, f"README.md: {len(found)} commands run {LAUNCHER} in the RL2 section, expected 1"
    return found[0]


def _expand(arg: str) -> str:
    """``$(gem-core ...)`` inside ``arg`` replaced by that command's output (gem-core's CLI, in process)."""
    from gem_core.cli import main

    def run(match: re.Match) -> str:
        argv = shlex.split(match.group(1))
        assert argv[0] == "gem-core", f"README.md: only gem-core commands are expanded, got {argv[0]!r}"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv[1:]) == 0, f"`{match.group(1)}` failed"
        return out.getvalue().strip()

    return re.sub(r"\$\(([^)]*)\)", run, arg)


def make_dataset_args(readme: Path = README, *, out: str = "train.jsonl", **replace: str) -> list[str]:
    """The arguments (after ``gem-core``) of the README's ``gem-core make-dataset rl2`` command that
    writes ``out``; ``replace``: option values to change (``n="4"`` replaces ``--n``'s value)."""
    found = [c for c in commands(rl2_block(readme)) if c[:3] == ["gem-core", "make-dataset", "rl2"] and c[c.index("--out") + 1] == out]
    assert len(found) == 1, f"README.md: {len(found)} make-dataset commands write {out} in the RL2 section, expected 1"
    args = found[0][1:]
    for name, value in replace.items():
        flag = f"--{name.replace('_', '-')}"
        assert flag in args, f"README.md's make-dataset command for {out} has no {flag}"
        args[args.index(flag) + 1] = value
    return args


def dataset_outputs(readme: Path = README) -> list[str]:
    """The files the README's make-dataset commands write, in order."""
    return [c[c.index("--out") + 1] for c in commands(rl2_block(readme)) if c[:3] == ["gem-core", "make-dataset", "rl2"]]


def launcher_args(readme: Path = README, **replace: str) -> list[str]:
    """The hydra overrides the README hands the launcher (``$(...)`` expanded); ``replace``: values to
    change, keyed by the override's name with ``__`` for ``.`` (``actor__model_name="/tmp/m"``)."""
    argv = _launcher_command(readme)
    args = [_expand(a) for a in argv[argv.index(LAUNCHER) + 1 :]]
    assert "..." not in args, "README.md's RL2 command is incomplete ('...'): it must run as written"
    for name, value in replace.items():
        key = name.replace("__", ".")
        hits = [i for i, a in enumerate(args) if a.lstrip("+").split("=", 1)[0] == key]
        assert hits, f"README.md's RL2 command does not set {key}"
        for i in hits:
            args[i] = f"{args[i].split('=', 1)[0]}={value}"
    return args


def torchrun_processes(readme: Path = README) -> int:
    """``--nproc_per_node`` of the README's torchrun command."""
    argv = _launcher_command(readme)
    assert argv[0] == "torchrun", f"README.md: the RL2 command starts with {argv[0]!r}, not torchrun"
    (flag,) = [a for a in argv if a.startswith("--nproc_per_node=")]
    return int(flag.split("=", 1)[1])
