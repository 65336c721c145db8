"""The Python tool: parsing code blocks, observations, the sandbox pool and its options."""

from __future__ import annotations

import time
import warnings

import pytest

from gem_core.tools.base import ToolCall
from gem_core.tools.python import PythonSandbox, PythonTool, SandboxUnavailable, require_bwrap


class _FakeSandbox:
    """Records the code it is given; answers like a sandbox that printed ``out``."""

    timeout = 3.0
    max_output_bytes = 100

    def __init__(self, **result):
        from gem_core.tools.python import ExecutionResult

        self.result = ExecutionResult(**{"exit_code": 0, **result})
        self.codes: list[str] = []

    def run(self, code, timeout=None):
        self.codes.append(code)
        return self.result

    def close(self):
        pass


# -- parsing (no sandbox needed) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "action,code",
    [
        ("<python>print(1)</python>", "print(1)"),
        ("think first\n```python\nx = 2\nprint(x)\n```\nthen answer", "x = 2\nprint(x)\n"),
        ("```py\nprint(3)\n```", "print(3)\n"),
        ("a <python>first()</python> b ```python\nsecond()\n```", "first()"),
        ("```python\nfirst()\n``` and <python>second()</python>", "first()\n"),
    ],
)
def test_finds_the_first_code_block(action, code):
    call = PythonTool(sandbox=_FakeSandbox()).find_call(action)  # type: ignore[arg-type]
    assert call is not None and call.payload == code
    assert action[call.start : call.end].endswith(("</python>", "```"))


@pytest.mark.parametrize("action", ["no code here", "<python>unclosed", "```\nprint(1)\n```", "\\boxed{4}", ""])
def test_no_call_without_a_complete_python_block(action):
    assert PythonTool(sandbox=_FakeSandbox()).find_call(action) is None  # type: ignore[arg-type]


def test_observation_formats():
    tool = PythonTool(sandbox=_FakeSandbox(stdout="42\n"))  # type: ignore[arg-type]
    result = tool.execute("<python>print(42)</python>")
    assert result is not None and result.ok and result.observation == "<output>\n42\n</output>"
    failing = PythonTool(sandbox=_FakeSandbox(stderr="Traceback...\nZeroDivisionError\n", exit_code=1))  # type: ignore[arg-type]
    result = failing.execute("<python>1/0</python>")
    assert not result.ok and "ZeroDivisionError" in result.observation and "[exit code 1]" in result.observation
    slow = PythonTool(sandbox=_FakeSandbox(exit_code=None, signal=9, timed_out=True))  # type: ignore[arg-type]
    result = slow.execute("<python>while True: pass</python>")
    assert not result.ok and "timed out after 3 s" in result.observation
    silent = PythonTool(sandbox=_FakeSandbox())  # type: ignore[arg-type]
    assert silent.execute("<python>x = 1</python>").observation == "<output>\n(no output)\n</output>"
    empty = silent.run(ToolCall("python", "  \n ", 0, 10))
    assert not empty.ok and "empty" in empty.observation


def test_instructions_name_the_syntax_and_timeout():
    text = PythonTool(sandbox=_FakeSandbox()).instructions()  # type: ignore[arg-type]
    assert "<python>" in text and "```python" in text and "3 seconds" in text


def test_missing_bwrap_is_a_clear_error_naming_the_package(monkeypatch):
    monkeypatch.setattr("gem_core.tools.sandbox.policy.shutil.which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap.*apt-get install -y bubblewrap"):
        require_bwrap()
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        PythonSandbox()


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="isolation"):
        PythonSandbox(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="either"):
        PythonTool(sandbox=_FakeSandbox(), workers=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of module names"):
        PythonSandbox(preload="numpy")  # type: ignore[arg-type]  # would preload "n", "u", "m", ...
    for timeout in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            PythonSandbox(timeout=timeout)
    with pytest.raises(ValueError, match="cpu_seconds must be positive"):
        PythonSandbox(cpu_seconds=0)
    assert PythonSandbox(cpu_seconds=1.5).cpu_seconds == 2  # RLIMIT_CPU counts whole seconds


def test_isolation_none_warns_loudly_and_still_runs_with_limits():
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        sb = PythonSandbox(workers=1, isolation="none", timeout=1.0, preload=())
    with sb:
        assert sb.run("print(sum(range(10)))").stdout == "45\n"
        env = sb.run("import os\nprint(sorted(os.environ))").stdout
        assert "LD_BIND_NOW" not in env and "PATH" in env  # the worker's own start-up settings stay its own
        started = time.monotonic()
        late = sb.run("while True: pass")
        assert late.timed_out and late.duration >= 1.0 and time.monotonic() - started < 10  # room for load
        assert "MemoryError" in sb.run("x = bytearray(4 * 1024 ** 3)").stderr


# -- the real sandbox ------------------------------------------------------------------------------


def test_runs_code_and_reports_errors(sandbox):
    ok = sandbox.run("import math\nprint(math.factorial(10))")
    assert ok.ok and ok.stdout == "3628800\n" and ok.stderr == ""
    err = sandbox.run("def f():\n    return 1 / 0\nf()")
    assert err.exit_code == 1 and 'File "<python>", line 2, in f' in err.stderr and "return 1 / 0" in err.stderr
    assert "worker.py" not in err.stderr  # the traceback shows the snippet's frames only
    syntax = sandbox.run("def (:")
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr
    assert sandbox.run("import sys\nsys.exit(3)").exit_code == 3
    assert sandbox.run("print('a', flush=True)\nimport os\nos._exit(5)").exit_code == 5


def test_snippet_sees_a_fresh_private_temp_dir_and_an_empty_environment(sandbox):
    r = sandbox.run(
        "import os, sys\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
        "open('data.txt', 'w').write('hello')\nprint(open('data.txt').read())\nprint(sorted(os.environ))"
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "True" and lines[1] == "hello"
    assert eval(lines[2]) == sorted(
        [
            "HOME",
            "LANG",
            "MKL_NUM_THREADS",
            "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "PATH",
            "PWD",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONUNBUFFERED",
            "TMPDIR",
        ]
    )


def test_what_the_worker_prepares_once_is_fresh_in_every_call(sandbox):
    # argv, the streams, signal dispositions and the environment are made once in the worker and
    # inherited by each child: a snippet that changes them must not change them for the next call.
    probe = (
        "import os, signal, sys\n"
        "print(sys.argv, sys.stdout.errors, sys.stderr.line_buffering, os.environ['HOME'])\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
        " signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN, signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN)\n"
    )
    first = sandbox.run(probe)
    assert first.ok, first.stderr
    meddle = sandbox.run(
        "import io, os, signal, sys\nsys.argv.append('x')\nprint('meddled', flush=True)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\nos.environ['HOME'] = '/elsewhere'\n"
        "sys.stdout = io.StringIO()\nsys.__stdout__.close()"
    )
    assert meddle.ok and meddle.stdout == "meddled\n"
    for _ in range(2 * sandbox.workers):  # every worker has served a call after the meddling one
        assert sandbox.run(probe).stdout == first.stdout
    assert first.stdout.splitlines() == ["['<python>'] backslashreplace True /tmp/work", "True True True"]


def test_the_rehearsal_before_a_request_leaves_nothing_a_snippet_can_see(sandbox):
    # Each child runs a line of its own before its request comes (worker.rehearse): no output of it, no
    # name from it, and tracebacks and linecache show the snippet's own lines, never the rehearsal's.
    result = sandbox.run("import linecache, sys\nprint('_' in globals(), linecache.getline('<python>', 1).strip())\nraise ValueError('own line')\n")
    assert result.exit_code == 1
    assert result.stdout == "False import linecache, sys\n"
    assert "line 3, in <module>" in result.stderr and "raise ValueError('own line')" in result.stderr
    assert "sum(range(100))" not in result.stdout + result.stderr


def test_a_timeout_of_one_second_returns_at_the_timeout(sandbox):
    """Killed at its second (the reply's duration), returned well before the code would end; the room is for load."""
    for code in ("while True: pass", "import time\ntime.sleep(300)", "import os\nos.close(1)\nwhile True: pass"):
        started = time.monotonic()
        r = sandbox.run(code, timeout=1.0)
        assert r.timed_out and 1.0 <= r.duration < 10 and time.monotonic() - started < 10


def test_output_is_truncated_with_a_marker():
    require = pytest.importorskip("sandbox_support")
    require.require_bwrap()
    with PythonSandbox(workers=1, max_output_bytes=100, preload=()) as sb:
        r = sb.run("print('y' * 5000)")
        assert r.truncated and len(r.stdout) == 100
        assert r.output(100).endswith("[... output truncated: more than 100 bytes ...]")
        obs = PythonTool(sandbox=sb).execute("<python>print('z' * 5000)</python>")
        assert obs is not None and not obs.ok and "output truncated" in obs.observation


def test_a_worker_killed_from_outside_is_replaced(sandbox):
    before = sandbox.replaced
    workers = sandbox.pool.live_workers()
    for worker in workers:
        worker.kill()  # as if the machine's OOM killer took them
    results = [sandbox.run("print('still here')") for _ in range(4)]
    assert any(r.error for r in results) or sandbox.replaced > before
    assert sandbox.run("print('still here')").stdout == "still here\n"
    assert sandbox.replaced >= before + len(workers)


def test_concurrent_calls_from_threads(sandbox):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: sandbox.run(f"print({i} * {i})").stdout, range(40)))
    assert outs == [f"{i * i}\n" for i in range(40)]


def test_closed_sandbox_refuses_calls():
    import sandbox_support

    sandbox_support.require_bwrap()
    sb = PythonSandbox(workers=1, preload=()).start()
    sb.close()
    sb.close()  # twice is fine
    from gem_core.tools.python import SandboxError

    with pytest.raises(SandboxError, match="closed"):
        sb.run("print(1)")


def test_tool_end_to_end(sandbox):
    tool = PythonTool(sandbox=sandbox)
    result = tool.execute("Let me compute.\n```python\nprint(sum(i * i for i in range(10)))\n```")
    assert result is not None and result.ok and result.observation == "<output>\n285\n</output>"
    tool.close()  # a shared sandbox is not closed by the tool
    assert sandbox.run("print(1)").ok


def test_no_warning_in_default_mode(sandbox):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sandbox.run("print(1)").ok


def test_a_pool_whose_workers_cannot_be_replaced_says_so():
    import sandbox_support

    sandbox_support.require_bwrap()
    import gem_core.tools.sandbox.pool as pool_module
    from gem_core.tools.python import SandboxError

    sb = PythonSandbox(workers=1, preload=()).start()
    try:
        real_worker = pool_module.WorkerProcess

        class Broken:
            def __init__(self, spec):
                raise SandboxUnavailable("cannot start (test)")

        pool_module.WorkerProcess = Broken  # type: ignore[misc]
        try:
            for worker in sb.pool.live_workers():
                worker.kill()
            try:  # the dead worker is noticed at checkout (an error) or mid-call (an error result)
                lost = sb.run("print(1)")
                assert lost.error is not None
            except SandboxError as exc:
                assert "no worker left" in str(exc)
            with pytest.raises(SandboxError, match="no worker left"):
                sb.run("print(1)")
        finally:
            pool_module.WorkerProcess = real_worker  # type: ignore[misc]
    finally:
        sb.close()


def test_a_forked_process_gets_its_own_workers(sandbox):
    import os

    assert sandbox.run("print('parent')").ok
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers are not ours to use
        try:
            out = sandbox.run("print('child')").stdout
            os.write(write_end, out.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 100) == b"child\n"
    os.close(read_end)
    assert sandbox.run("print('parent again')").stdout == "parent again\n"


def test_code_reaches_the_child_unchanged_and_bad_per_call_timeouts_are_rejected(sandbox):
    text = "h\u00e9 \u2603 \U0001f600"
    result = sandbox.run(f"s = {text!r}\nprint(len(s), ascii(s))")
    assert result.ok and result.stdout == f"{len(text)} {ascii(text)}\n", result
    # A lone surrogate (which JSON from a model can carry) reaches the child, which reports that
    # Python cannot compile it, as `python` would.
    lone = sandbox.run("print('\ud800')")
    assert lone.exit_code == 1 and "surrogates not allowed" in lone.stderr, lone
    assert sandbox.run("print(1)", timeout=0.5).stdout == "1\n"
    for timeout in (0, float("inf")):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            sandbox.run("print(1)", timeout=timeout)


def test_a_snippet_larger_than_a_pipe_buffer_is_handed_over_whole(sandbox):
    # 2 MB of code: the host writes it to the child's pipe in pieces, waiting for the child to read.
    code = "# padding\n" * 200_000 + "print('tail ran')"
    result = sandbox.run(code)
    assert result.ok and result.stdout == "tail ran\n"


def test_numpy_is_preloaded_only_when_asked():
    pytest.importorskip("numpy")
    require = pytest.importorskip("sandbox_support")
    require.require_bwrap()
    from gem_core.tools.python import DEFAULT_PRELOAD

    probe = "import sys\nprint('numpy' in sys.modules, 'math' in sys.modules)"
    with PythonSandbox(workers=1, preload=(*DEFAULT_PRELOAD, "numpy")) as sb:
        assert sb.run(probe).stdout == "True True\n"
        assert sb.run("import numpy as np\nprint(int(np.arange(4).sum()))").stdout == "6\n"
    with PythonSandbox(workers=1, preload=("math",)) as sb:
        assert sb.run(probe).stdout == "False True\n"
        assert sb.run("import numpy as np\nprint(int(np.arange(4).sum()))").stdout == "6\n"  # imported on demand


def test_each_child_has_a_small_file_descriptor_table(sandbox):
    # The child moves its pipes onto fds 0-4 without growing its fd table (growing it to 64k
    # entries cost every call half a megabyte to allocate, copy and free).
    result = sandbox.run("print([l.split()[1] for l in open('/proc/self/status') if l.startswith('FDSize')][0])")
    assert result.ok and int(result.stdout) <= 1024
    # The streams, the exit-report pipe (4) and listdir's own fd (3, where the request pipe was): no more.
    assert sandbox.run("import os\nprint(sorted(os.listdir('/proc/self/fd')))").stdout == "['0', '1', '2', '3', '4']\n"
