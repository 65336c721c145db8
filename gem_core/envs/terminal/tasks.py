"""The shipped Terminal tasks, as data (terminal-bench style): the files the task starts with, the
instruction the agent reads, a checker script (bash, run in ``/app`` after the episode; exit 0 means
solved) and a reference solution (commands that solve it, used by the oracle policy and the tests).

The agent never sees the checker: it runs after the agent's processes are gone. Checkers that judge a
script the agent wrote run it on inputs of their own, so a hard-coded answer does not pass, and run it
only through ``agent`` (``agent bash script.sh``): that confines it (see ``supervisor.py``), so it cannot
trace, write into or signal the checker's own processes. The tests
assert, for every task, that the reference solution passes and that the untouched files fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXECUTABLE, PRIVATE, PUBLIC = 0o755, 0o600, 0o644


@dataclass(frozen=True)
class TerminalTask:
    name: str
    instruction: str
    files: dict[str, str | tuple[str, int]]
    check: str
    solution: tuple[str, ...]
    max_turns: int = 10
    tags: tuple[str, ...] = field(default=())

    def file_list(self) -> list[tuple[str, str, int]]:
        """``(path, text, mode)`` triples, the shape the sandbox writes."""
        out = []
        for path, spec in self.files.items():
            text, mode = (spec, PUBLIC) if isinstance(spec, str) else spec
            out.append((path, text, mode))
        return out


_LOG = (
    "\n".join(
        [
            "2024-05-01 10:00:01 INFO service started",
            "2024-05-01 10:00:07 ERROR cannot open config",
            "2024-05-01 10:01:13 WARN slow response",
            "2024-05-01 10:02:44 ERROR timeout talking to db",
            "2024-05-01 10:03:00 INFO retrying",
            "2024-05-01 10:03:05 error lowercase is not an ERROR line? it is: contains ERROR",
            "2024-05-01 10:04:30 INFO ok",
            "2024-05-01 10:05:12 ERROR disk almost full",
            "2024-05-01 10:06:00 DEBUG ERRORS_SEEN=3",
        ]
    )
    + "\n"
)

_PEOPLE = "name,age,city\nAlice,31,Paris\nBob,25,Berlin\nChloe,40,Paris\nDavid,19,Madrid\nEmma,52,Paris\nFinn,33,Berlin\n"

TASKS: tuple[TerminalTask, ...] = (
    TerminalTask(
        name="count-errors",
        instruction="Count the lines of /app/app.log that contain the text ERROR (case-sensitive) and write that number, alone, to /app/error_count.txt.",
        files={"app.log": _LOG},
        check='[ "$(tr -d "[:space:]" < error_count.txt)" = "5" ]',
        solution=("grep -c ERROR app.log > error_count.txt",),
    ),
    TerminalTask(
        name="fix-script",
        instruction="/app/sum.sh should print the sum of the integers in the file given as its first argument (one per line), "
        "but it is broken. Fix it so that `bash /app/sum.sh /app/numbers.txt` prints 42.",
        files={
            "sum.sh": ('#!/bin/bash\ntotal=0\nwhile read -r n; do\n  total=$((total + n)\ndone < "$1"\necho "$total"\n', EXECUTABLE),
            "numbers.txt": "10\n20\n12\n",
        },
        check='printf "1\\n2\\n3\\n100\\n" > /tmp/n.txt && [ "$(agent bash sum.sh /tmp/n.txt)" = "106" ] && [ "$(agent bash sum.sh numbers.txt)" = "42" ]',
        solution=("sed -i 's/total=$((total + n)$/total=$((total + n))/' sum.sh", "bash sum.sh numbers.txt"),
    ),
    TerminalTask(
        name="rename-files",
        instruction="In /app/photos, rename every file IMG_<n>.JPG to photo_<n>.jpg (same number, lower-case extension). Leave other files alone.",
        files={"photos/IMG_001.JPG": "a", "photos/IMG_002.JPG": "b", "photos/IMG_017.JPG": "c", "photos/notes.txt": "keep me"},
        check='[ "$(cd photos && ls | tr "\\n" " ")" = "notes.txt photo_001.jpg photo_002.jpg photo_017.jpg " ] && [ "$(cat photos/photo_017.jpg)" = c ]',
        solution=('cd photos && for f in IMG_*.JPG; do n=${f#IMG_}; mv "$f" "photo_${n%.JPG}.jpg"; done; cd /app',),
    ),
    TerminalTask(
        name="csv-field",
        instruction="/app/people.csv has a header and the columns name,age,city. Write the names of the people who live in Paris, "
        "sorted alphabetically, one per line, to /app/paris.txt.",
        files={"people.csv": _PEOPLE},
        check='[ "$(cat paris.txt)" = "$(printf "Alice\\nChloe\\nEmma")" ]',
        solution=("grep ',Paris$' people.csv | cut -d, -f1 | sort > paris.txt",),
    ),
    TerminalTask(
        name="make-tree",
        instruction="Create the directory /app/project with the subdirectories src, tests and docs, and a file /app/project/README.md "
        "whose first line is exactly: # Project",
        files={"hint.txt": "Directories go under /app/project.\n"},
        check='[ -d project/src ] && [ -d project/tests ] && [ -d project/docs ] && [ "$(head -n 1 project/README.md)" = "# Project" ]',
        solution=("mkdir -p project/src project/tests project/docs && echo '# Project' > project/README.md",),
    ),
    TerminalTask(
        name="sort-uniq",
        instruction="/app/words.txt has one word per line, with repeats. Write each distinct word once, sorted alphabetically, "
        "to /app/unique.txt, and the most frequent word to /app/top.txt.",
        files={"words.txt": "pear\napple\nfig\napple\npear\napple\nkiwi\nfig\napple\n"},
        check='[ "$(cat unique.txt)" = "$(printf "apple\\nfig\\nkiwi\\npear")" ] && [ "$(tr -d "[:space:]" < top.txt)" = apple ]',
        solution=("sort -u words.txt > unique.txt", "sort words.txt | uniq -c | sort -rn | head -n 1 | sed 's/^ *[0-9]* //' > top.txt"),
    ),
    TerminalTask(
        name="largest-file",
        instruction="Find the largest regular file anywhere under /app/data and write its path relative to /app/data "
        "(for example sub/file.bin) to /app/largest.txt.",
        files={
            "data/a.txt": "x" * 120,
            "data/logs/b.log": "y" * 900,
            "data/logs/old/c.log": "z" * 2500,
            "data/img/d.bin": "w" * 1800,
            "data/e.txt": "v" * 10,
        },
        check='[ "$(tr -d "[:space:]" < largest.txt | sed "s|^\\./||")" = logs/old/c.log ]',
        solution=("cd data && find . -type f -printf '%s %P\\n' | sort -rn | head -n 1 | cut -d' ' -f2 > ../largest.txt; cd /app",),
    ),
    TerminalTask(
        name="fix-permissions",
        instruction="Make /app/run.sh executable by its owner, and make /app/secret.txt readable and writable by its owner only (mode 600).",
        files={"run.sh": ("#!/bin/bash\necho running\n", PUBLIC), "secret.txt": ("token=abc\n", 0o666)},
        check='[ -x run.sh ] && [ "$(stat -c %a secret.txt)" = 600 ] && [ "$(agent ./run.sh)" = running ]',
        solution=("chmod u+x run.sh && chmod 600 secret.txt",),
    ),
    TerminalTask(
        name="write-script",
        instruction="Write /app/fizzbuzz.sh: given a number N as its first argument, it prints the numbers 1..N, one per line, "
        "but Fizz for multiples of 3, Buzz for multiples of 5 and FizzBuzz for multiples of both. "
        "It must work with `bash /app/fizzbuzz.sh 15`.",
        files={"README": "Write fizzbuzz.sh here.\n"},
        check=(
            'want() { for i in $(seq "$1"); do if (( i % 15 == 0 )); then echo FizzBuzz; elif (( i % 3 == 0 )); then echo Fizz; '
            'elif (( i % 5 == 0 )); then echo Buzz; else echo "$i"; fi; done; }\n'
            'for n in 1 7 15 31; do [ "$(agent bash fizzbuzz.sh "$n")" = "$(want "$n")" ] || exit 1; done'
        ),
        solution=(
            "printf '%s\\n' 'for i in $(seq \"$1\"); do' '  if (( i % 15 == 0 )); then echo FizzBuzz' "
            "'  elif (( i % 3 == 0 )); then echo Fizz' '  elif (( i % 5 == 0 )); then echo Buzz' '  else echo \"$i\"; fi' 'done' > fizzbuzz.sh",
            "bash fizzbuzz.sh 15 | tail -n 3",
        ),
    ),
    TerminalTask(
        name="find-replace",
        instruction="In every .ini file under /app/conf, replace the line host=localhost with host=db.internal. Change nothing else.",
        files={
            "conf/app.ini": "[db]\nhost=localhost\nport=5432\n",
            "conf/worker.ini": "[db]\nhost=localhost\nuser=worker\n",
            "conf/readme.txt": "host=localhost\n",
        },
        check=(
            '[ "$(cat conf/app.ini)" = "$(printf "[db]\\nhost=db.internal\\nport=5432")" ] && '
            '[ "$(cat conf/worker.ini)" = "$(printf "[db]\\nhost=db.internal\\nuser=worker")" ] && '
            '[ "$(cat conf/readme.txt)" = host=localhost ]'
        ),
        solution=("sed -i 's/^host=localhost$/host=db.internal/' conf/*.ini",),
    ),
)

TASK_NAMES: tuple[str, ...] = tuple(task.name for task in TASKS)
BY_NAME = {task.name: task for task in TASKS}
