"""The shipped Terminal tasks (terminal-bench style). Each task draws its episode from a seeded
``random.Random``: the files the agent starts with, the instruction it reads, the checks that decide
success, and a reference solution (commands that solve it, used by the oracle policy and the tests).

The numbers, words and inputs change from episode to episode: an answer or a script written for one
episode (``echo 5 > error_count.txt``, a ``sum.sh`` that knows the checker's input) fails the next one.

Checks are data, not a shell script. The sandbox's supervisor (trusted Python, never in the agent's
reach) evaluates them after every process of the agent's is gone, and the host sends them only then, so
neither what they expect nor the inputs they use are anywhere the agent could read them before or while
they run. The kinds (``supervisor.py`` implements them):

* ``text(path, want, compare)`` -- the file's text, compared as ``compare`` says: ``exact``,
  ``lines`` (trailing newlines ignored, what ``"$(cat f)"`` compares), ``no_space`` (every
  whitespace character removed first, like ``tr -d '[:space:]'``) or ``first_line``. ``want`` may be a
  list of accepted answers.
* ``is_dir(path)``, ``names(path, want)`` (the directory's entries, exactly), ``mode(path, bits)``,
  ``executable(path)`` (by its owner).
* ``runs(argv, want, inputs)`` -- the agent's program, started by the supervisor in a PID namespace
  of its own, as the agent's user, confined, with the agent's limits; ``inputs`` are files written to
  a new directory of a random name (``{inputs}`` in ``argv``); its standard output is compared like
  ``"$(program)"``. The program is the agent's and may change files: ``runs`` checks come after the
  checks that read files.

Every path is relative to ``/app`` and is opened without following any link and without blocking: a
link (or a path through one), a FIFO, a socket or a file over a size bound is a wrong answer. The tests
assert, for every task and many seeds, that the reference solution passes and that the untouched files
fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXECUTABLE, PRIVATE, PUBLIC = 0o755, 0o600, 0o644


# -- checks (JSON-ready: they travel to the supervisor on its private pipe)
def text(path: str, want: str | list[str], compare: str = "exact") -> dict[str, Any]:
    return {"check": "text", "path": path, "want": want, "compare": compare}


def is_dir(path: str) -> dict[str, Any]:
    return {"check": "dir", "path": path}


def names(path: str, want: list[str]) -> dict[str, Any]:
    return {"check": "names", "path": path, "want": sorted(want)}


def mode(path: str, bits: int) -> dict[str, Any]:
    return {"check": "mode", "path": path, "want": bits}


def executable(path: str) -> dict[str, Any]:
    return {"check": "executable", "path": path}


def runs(argv: list[str], want: str, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    return {"check": "run", "argv": argv, "inputs": inputs or {}, "want": want, "compare": "lines"}


@dataclass(frozen=True)
class Episode:
    """One episode of a task: what the agent is told and given, what the checker verifies, and commands
    that solve it."""

    instruction: str
    files: tuple[tuple[str, str, int], ...]  # (path under /app, text, mode)
    checks: tuple[dict[str, Any], ...]
    solution: tuple[str, ...]


@dataclass(frozen=True)
class TerminalTask:
    name: str
    build: Callable[[random.Random], Episode]
    max_turns: int = 10
    tags: tuple[str, ...] = field(default=())


def _files(files: dict[str, str | tuple[str, int]]) -> tuple[tuple[str, str, int], ...]:
    """``(path, text, mode)`` triples, the shape the sandbox writes; a bare text is mode 644."""
    out = []
    for path, spec in files.items():
        content, bits = (spec, PUBLIC) if isinstance(spec, str) else spec
        out.append((path, content, bits))
    return tuple(out)


WORDS = ("apple", "pear", "fig", "kiwi", "plum", "lime", "mango", "grape", "peach", "melon", "olive", "cherry")
NAMES = ("Alice", "Bob", "Chloe", "David", "Emma", "Finn", "Gina", "Hugo", "Iris", "Jonas", "Karl", "Lena", "Mila", "Nora", "Omar", "Paul")


def count_errors(rng: random.Random) -> Episode:
    messages = {
        "INFO": ("service started", "retrying", "ok", "request served", "cache warmed"),
        "WARN": ("slow response", "queue almost full", "retry budget low"),
        "ERROR": ("cannot open config", "timeout talking to db", "disk almost full", "worker crashed"),
        "DEBUG": ("tick", "heartbeat sent", "gc pass"),
    }
    lines, share = [], rng.uniform(0.1, 0.5)  # how many lines are errors varies too
    for second in sorted(rng.sample(range(36000, 39600), rng.randint(16, 48))):
        level = "ERROR" if rng.random() < share else rng.choice(("INFO", "INFO", "WARN", "DEBUG"))
        lines.append(f"2024-05-01 {second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d} {level} {rng.choice(messages[level])}")
    # Decoys: "error" in lower case does not count; ERROR inside other text does.
    lines.insert(rng.randrange(len(lines) + 1), "2024-05-01 10:30:00 INFO an error in lower case is not an error line")
    lines.insert(rng.randrange(len(lines) + 1), f"2024-05-01 10:31:00 DEBUG ERRORS_SEEN={rng.randint(1, 9)}")
    count = sum("ERROR" in line for line in lines)
    return Episode(
        instruction="Count the lines of /app/app.log that contain the text ERROR (case-sensitive) and write that number, alone, to /app/error_count.txt.",
        files=_files({"app.log": "\n".join(lines) + "\n"}),
        checks=(text("error_count.txt", str(count), "no_space"),),
        solution=("grep -c ERROR app.log > error_count.txt",),
    )


def fix_script(rng: random.Random) -> Episode:
    def numbers(count: int, low: int) -> list[int]:
        return [rng.randint(low, 500) for _ in range(count)]

    given = numbers(rng.randint(3, 7), 1)
    # The checker's own inputs: other numbers (negative ones too), at a path of its own.
    trials = [given, numbers(rng.randint(2, 9), -50), numbers(rng.randint(2, 9), -50)]
    return Episode(
        instruction="/app/sum.sh should print the sum of the integers in the file given as its first argument (one per line), "
        f"but it is broken. Fix it so that `bash /app/sum.sh /app/numbers.txt` prints {sum(given)}.",
        files=_files(
            {
                "sum.sh": ('#!/bin/bash\ntotal=0\nwhile read -r n; do\n  total=$((total + n)\ndone < "$1"\necho "$total"\n', EXECUTABLE),
                "numbers.txt": "".join(f"{n}\n" for n in given),
            }
        ),
        checks=tuple(
            runs(["/bin/bash", "sum.sh", "{inputs}/numbers.txt"], str(sum(trial)), {"numbers.txt": "".join(f"{n}\n" for n in trial)}) for trial in trials
        ),
        solution=("sed -i 's/total=$((total + n)$/total=$((total + n))/' sum.sh", "bash sum.sh numbers.txt"),
    )


def rename_files(rng: random.Random) -> Episode:
    photos = {f"{n:03d}": rng.choice(WORDS) for n in rng.sample(range(1, 1000), rng.randint(3, 6))}
    files: dict[str, str | tuple[str, int]] = {f"photos/IMG_{n}.JPG": content for n, content in photos.items()}
    files["photos/notes.txt"] = "keep me"
    return Episode(
        instruction="In /app/photos, rename every file IMG_<n>.JPG to photo_<n>.jpg (same number, lower-case extension). Leave other files alone.",
        files=_files(files),
        checks=(
            names("photos", [*(f"photo_{n}.jpg" for n in photos), "notes.txt"]),
            *(text(f"photos/photo_{n}.jpg", content) for n, content in photos.items()),
            text("photos/notes.txt", "keep me"),
        ),
        solution=('cd photos && for f in IMG_*.JPG; do n=${f#IMG_}; mv "$f" "photo_${n%.JPG}.jpg"; done; cd /app',),
    )


def csv_field(rng: random.Random) -> Episode:
    people = rng.sample(NAMES, rng.randint(6, 10))
    cities = ["Paris", "Paris"] + [rng.choice(("Paris", "Berlin", "Madrid", "Rome", "Lisbon")) for _ in people[3:]] + ["Berlin"]
    rng.shuffle(cities)
    rows = [f"{name},{rng.randint(18, 80)},{city}" for name, city in zip(people, cities, strict=True)]
    paris = sorted(name for name, city in zip(people, cities, strict=True) if city == "Paris")
    return Episode(
        instruction="/app/people.csv has a header and the columns name,age,city. Write the names of the people who live in Paris, "
        "sorted alphabetically, one per line, to /app/paris.txt.",
        files=_files({"people.csv": "name,age,city\n" + "".join(f"{row}\n" for row in rows)}),
        checks=(text("paris.txt", "\n".join(paris), "lines"),),
        solution=("grep ',Paris$' people.csv | cut -d, -f1 | sort > paris.txt",),
    )


def make_tree(rng: random.Random) -> Episode:
    # Nothing to compute: the answer is the structure the instruction names.
    return Episode(
        instruction="Create the directory /app/project with the subdirectories src, tests and docs, and a file /app/project/README.md "
        "whose first line is exactly: # Project",
        files=_files({"hint.txt": "Directories go under /app/project.\n"}),
        checks=(is_dir("project/src"), is_dir("project/tests"), is_dir("project/docs"), text("project/README.md", "# Project", "first_line")),
        solution=("mkdir -p project/src project/tests project/docs && echo '# Project' > project/README.md",),
    )


def sort_uniq(rng: random.Random) -> Episode:
    chosen = rng.sample(WORDS, rng.randint(4, 7))
    counts = dict(zip(chosen, rng.sample(range(1, 8), len(chosen)), strict=True))  # distinct counts: one most frequent word
    words = [word for word, count in counts.items() for _ in range(count)]
    rng.shuffle(words)
    return Episode(
        instruction="/app/words.txt has one word per line, with repeats. Write each distinct word once, sorted alphabetically, "
        "to /app/unique.txt, and the most frequent word to /app/top.txt.",
        files=_files({"words.txt": "".join(f"{word}\n" for word in words)}),
        checks=(text("unique.txt", "\n".join(sorted(chosen)), "lines"), text("top.txt", max(counts, key=counts.__getitem__), "no_space")),
        solution=("sort -u words.txt > unique.txt", "sort words.txt | uniq -c | sort -rn | head -n 1 | sed 's/^ *[0-9]* //' > top.txt"),
    )


def largest_file(rng: random.Random) -> Episode:
    folders = ("", "logs/", "logs/old/", "img/", "img/raw/", "notes/", "notes/2024/", "cache/")
    paths = {f"{rng.choice(folders)}{rng.choice(WORDS)}.{rng.choice(('txt', 'log', 'bin', 'md'))}" for _ in range(rng.randint(5, 9))}
    sizes = dict(zip(sorted(paths), rng.sample(range(10, 5000), len(paths)), strict=True))
    largest = max(sizes, key=sizes.__getitem__)
    return Episode(
        instruction="Find the largest regular file anywhere under /app/data and write its path relative to /app/data "
        "(for example sub/file.bin) to /app/largest.txt.",
        files=_files({f"data/{path}": rng.choice("vwxyz") * size for path, size in sizes.items()}),
        checks=(text("largest.txt", [largest, f"./{largest}"], "no_space"),),
        solution=("cd data && find . -type f -printf '%s %P\\n' | sort -rn | head -n 1 | cut -d' ' -f2 > ../largest.txt; cd /app",),
    )


def fix_permissions(rng: random.Random) -> Episode:
    word = rng.choice(("running", "started", "ready", "alive", "working"))
    return Episode(
        instruction="Make /app/run.sh executable by its owner, and make /app/secret.txt readable and writable by its owner only (mode 600).",
        files=_files({"run.sh": (f"#!/bin/bash\necho {word}\n", PUBLIC), "secret.txt": (f"token={rng.getrandbits(64):016x}\n", 0o666)}),
        checks=(executable("run.sh"), mode("secret.txt", 0o600), runs(["./run.sh"], word)),
        solution=("chmod u+x run.sh && chmod 600 secret.txt",),
    )


def fizzbuzz(n: int) -> str:
    return "\n".join("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i) for i in range(1, n + 1))


def write_script(rng: random.Random) -> Episode:
    tried = sorted({rng.randint(1, 14), rng.randint(16, 100), 15 * rng.randint(1, 6)})
    return Episode(
        instruction="Write /app/fizzbuzz.sh: given a number N as its first argument, it prints the numbers 1..N, one per line, "
        "but Fizz for multiples of 3, Buzz for multiples of 5 and FizzBuzz for multiples of both. "
        "It must work with `bash /app/fizzbuzz.sh 15`.",
        files=_files({"README": "Write fizzbuzz.sh here.\n"}),
        checks=tuple(runs(["/bin/bash", "fizzbuzz.sh", str(n)], fizzbuzz(n)) for n in tried),
        solution=(
            "printf '%s\\n' 'for i in $(seq \"$1\"); do' '  if (( i % 15 == 0 )); then echo FizzBuzz' "
            "'  elif (( i % 3 == 0 )); then echo Fizz' '  elif (( i % 5 == 0 )); then echo Buzz' '  else echo \"$i\"; fi' 'done' > fizzbuzz.sh",
            "bash fizzbuzz.sh 15 | tail -n 3",
        ),
    )


def find_replace(rng: random.Random) -> Episode:
    before, after = {}, {}
    for name in rng.sample(("app", "worker", "cache", "api", "billing"), rng.randint(2, 4)):
        extra = rng.sample((f"port={rng.randint(1024, 9999)}", f"user={name}", "debug=false", f"timeout={rng.randint(1, 60)}"), 2)
        body = ["host=localhost", *extra]
        rng.shuffle(body)
        lines = ["[db]", *body]
        before[f"conf/{name}.ini"] = "\n".join(lines) + "\n"
        after[f"conf/{name}.ini"] = "\n".join("host=db.internal" if line == "host=localhost" else line for line in lines)
    before["conf/readme.txt"] = "host=localhost\n"  # not an .ini file: unchanged
    after["conf/readme.txt"] = "host=localhost"
    return Episode(
        instruction="In every .ini file under /app/conf, replace the line host=localhost with host=db.internal. Change nothing else.",
        files=_files(dict(before)),
        checks=tuple(text(path, want, "lines") for path, want in after.items()),
        solution=("sed -i 's/^host=localhost$/host=db.internal/' conf/*.ini",),
    )


TASKS: tuple[TerminalTask, ...] = (
    TerminalTask("count-errors", count_errors),
    TerminalTask("fix-script", fix_script),
    TerminalTask("rename-files", rename_files),
    TerminalTask("csv-field", csv_field),
    TerminalTask("make-tree", make_tree),
    TerminalTask("sort-uniq", sort_uniq),
    TerminalTask("largest-file", largest_file),
    TerminalTask("fix-permissions", fix_permissions),
    TerminalTask("write-script", write_script),
    TerminalTask("find-replace", find_replace),
)

TASK_NAMES: tuple[str, ...] = tuple(task.name for task in TASKS)
BY_NAME = {task.name: task for task in TASKS}
