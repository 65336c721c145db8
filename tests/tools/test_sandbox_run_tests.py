"""Code execution as code envs need it: stdin in, stdout out, several cases in one sandbox call."""

from __future__ import annotations

import pytest

from gem_core.tools.sandbox import outputs_match

SUM = "a, b = map(int, input().split())\nprint(a + b)"
# A case's time limit (wall clock) with room for a loaded machine: each case here is a fork that prints or exits at once.
LIMIT_S = 5.0


def test_stdin_reaches_the_snippet_as_a_real_file(sandbox):
    assert sandbox.run("print(input()[::-1])", stdin="abc\n").stdout == "cba\n"
    assert sandbox.run("import sys\nprint(sys.stdin.buffer.read())", stdin="x y").stdout == "b'x y'\n"
    assert sandbox.run("print(open(0).read().split())", stdin="1 2\n3").stdout == "['1', '2', '3']\n"
    assert sandbox.run("import sys\nprint(repr(sys.stdin.read()))").stdout == "''\n"  # no stdin: empty


def test_every_case_passes(sandbox):
    run = sandbox.run_tests(SUM, [("1 2", "3"), ("10 20\n", "30\n"), ("-1 1", "0")], time_limit_s=LIMIT_S)
    assert run.passed and run.first_failure is None and run.pass_rate == 1.0 and run.error is None
    assert [c.verdict for c in run.cases] == ["passed"] * 3
    assert [c.stdout for c in run.cases] == ["3\n", "30\n", "0\n"]


def test_each_case_has_its_verdict_exit_status_and_the_first_failure_is_named(sandbox):
    code = (
        "import sys, time\nn = int(input())\n"
        "if n == 2: print(99)\n"
        "elif n == 3: time.sleep(300)\n"
        "elif n == 4: sys.exit(7)\n"
        "elif n == 5: raise ValueError('bad input')\n"
        "else: print(n)"
    )
    cases = [(str(n), str(n)) for n in range(1, 7)]
    run = sandbox.run_tests(code, cases, time_limit_s=LIMIT_S)
    assert [c.verdict for c in run.cases] == [
        "passed", "wrong answer", "time limit", "runtime error", "runtime error", "passed",
    ]  # fmt: skip
    assert run.first_failure == 1 and not run.passed and run.error is None
    assert run.cases[1].stdout == "99\n" and run.cases[1].expected == "2"
    # killed at its limit, long before its sleep would end (the pytest timeout guards a kill that never comes)
    assert run.cases[2].timed_out and run.cases[2].signal == 9 and LIMIT_S <= run.cases[2].duration < 300
    assert run.cases[3].exit_code == 7
    assert run.cases[4].exit_code == 1 and "ValueError: bad input" in run.cases[4].stderr


def test_memory_limit_per_call(sandbox):
    hog = "x = bytearray(400 * 1024 * 1024)\nprint('allocated')"
    small = sandbox.run_tests(hog, [("", "allocated")], time_limit_s=5.0, memory_mb=256)
    assert small.cases[0].verdict == "runtime error" and "MemoryError" in small.cases[0].stderr, small
    large = sandbox.run_tests(hog, [("", "allocated")], time_limit_s=5.0, memory_mb=2048)
    assert large.passed, large


def test_a_case_is_cut_at_the_output_cap_and_cases_are_isolated(sandbox):
    run = sandbox.run_tests(
        "import os\nn = int(input())\nopen('state', 'a').write('.')\nprint(n, len(open('state').read()))\nif n == 2: print('x' * 10**6)",
        [("1", "1 1"), ("2", None), ("3", "3 1")],
        time_limit_s=LIMIT_S,
    )
    assert run.cases[1].verdict == "output limit" and len(run.cases[1].stdout) <= sandbox.max_output_bytes
    # Each case starts in an empty directory: what case 1 wrote is not there for case 3.
    assert run.cases[0].passed and run.cases[2].passed, run.cases
    again = sandbox.run_tests("import os\nprint(os.listdir('.'), os.listdir('..'))", [("", "[] ['case-0']")])
    assert again.passed, again.cases


def test_a_syntax_error_fails_every_case_with_the_message(sandbox):
    run = sandbox.run_tests("def (:", [("", "1"), ("", "2")], time_limit_s=LIMIT_S)
    assert [c.verdict for c in run.cases] == ["runtime error"] * 2
    assert all("SyntaxError" in c.stderr for c in run.cases)


def test_expected_none_needs_only_a_clean_exit_and_compare_is_pluggable(sandbox):
    run = sandbox.run_tests("print(input().upper())", [("a", None), ("b", "b")], compare=lambda out, exp: out.strip().lower() == exp)
    assert run.passed


def test_the_default_comparison_ignores_trailing_whitespace_only():
    assert outputs_match("1 2  \n3\n\n", "1 2\n3")
    assert outputs_match("a\r\nb\r\n", "a\nb\n")
    assert not outputs_match("1 2", "1  2")
    assert not outputs_match("1\n2", "12")


def test_bad_arguments_are_rejected(sandbox):
    with pytest.raises(ValueError, match="at least one case"):
        sandbox.run_tests("print(1)", [])
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        sandbox.run_tests("print(1)", [("", "1")], time_limit_s=0)


def test_many_cases_in_one_call_are_quick(sandbox):
    """50 cases are one sandbox call, each case a fork of that call's one harness process, which has its modules
    imported already (no interpreter starts per case: what makes them quick): counted, not timed; the case limit
    leaves room for a loaded machine."""
    cases = [(f"{i} {i}", str(2 * i)) for i in range(50)]
    calls = sum(worker.calls for worker in sandbox.pool.live_workers())
    # socket and ctypes: the harness imports them, a fresh `python -I` running this snippet would not have them
    code = SUM + "\nimport os, sys\nsys.stderr.write(f\"{os.getppid()} {'socket' in sys.modules and 'ctypes' in sys.modules}\")"
    run = sandbox.run_tests(code, cases, time_limit_s=LIMIT_S)
    assert run.passed, [(c.verdict, c.stderr) for c in run.cases if not c.passed]
    assert sum(worker.calls for worker in sandbox.pool.live_workers()) == calls + 1
    reports = {c.stderr for c in run.cases}
    assert len(reports) == 1 and reports.pop().endswith(" True"), {c.stderr for c in run.cases}  # one parent; forks of it
