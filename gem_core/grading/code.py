"""Code grading: the response's last fenced code block run against a problem's tests in the shared
Python sandbox (:class:`gem_core.tools.sandbox.PythonSandbox`, bubblewrap), all cases in one call.

Tests come as GEM's code datasets write them (a dict, or its JSON text): ``{"inputs": [...],
"outputs": [...]}`` for stdin/stdout programs (TACO/APPS, CodeContests), plus ``"fn_name"`` for
function-call problems, whose ``inputs`` are argument lists and ``outputs`` the return values (a value,
or the value wrapped in a one-element list as TACO writes them); a ``class Solution`` method of that
name works too. At most ``max_tests`` cases run (the ones with the longest input, as GEM does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gem_core.parsing import all_fenced, echo

#: Code longer than this is not run (format error).
MAX_CODE_CHARS = 100_000

_CALL_HARNESS = """

def __gem_call():
    import json as _json, sys as _sys
    _args = _json.loads(_sys.stdin.read())
    _name = {name!r}
    _fn = globals().get(_name)
    if _fn is None and "Solution" in globals():
        _fn = getattr(globals()["Solution"](), _name)
    _result = _fn(*_args)
    print(_json.dumps(_result, default=list))

__gem_call()
"""


def last_code_block(text: Any) -> str | None:
    """The body of the last fenced block (```python, ```py, ``` ...) in ``text``, or None."""
    if not isinstance(text, str) or "```" not in text:
        return None
    blocks = all_fenced(text)  # linear in the text (a (.*?) regex is quadratic on hostile text)
    return blocks[-1].body if blocks else None


def parse_tests(tests: Any) -> dict[str, Any]:
    """A problem's tests as a dict with ``inputs``, ``outputs`` and maybe ``fn_name`` (JSON text accepted)."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError("tests must be {'inputs': [...], 'outputs': [...]} (and 'fn_name' for function calls)")
    if len(tests["inputs"]) != len(tests["outputs"]) or not tests["inputs"]:
        raise ValueError("tests need as many outputs as inputs, at least one")
    return tests


def _json_equal(actual: str, expected: str) -> bool:
    try:
        got = json.loads(actual)
    except ValueError:
        return False
    want = json.loads(expected)
    return got == want or [got] == want


@dataclass
class CodeGrade:
    """One graded response: cases passed of those run, the first failing case (in ``failure``)."""

    code: str | None
    passed: int = 0
    total: int = 0
    failure: dict[str, Any] | None = None
    error: str | None = None
    sandbox_failed: bool = False  # ``error`` is the sandbox's own failure (infrastructure), not the code's
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def all_passed(self) -> bool:
        return self.code is not None and self.total > 0 and self.passed == self.total and self.error is None

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


def grade_code(response: Any, tests: Any, *, sandbox: Any = None, max_tests: int = 12, time_limit_s: float = 2.0) -> CodeGrade:
    """Run the last fenced block of ``response`` against ``tests`` (see the module docstring)."""
    code = last_code_block(response)
    if code is None or not code.strip() or len(code) > MAX_CODE_CHARS:
        return CodeGrade(None if code is None or not code.strip() else code, error=None if code is None or not code.strip() else "code too long")
    tests = parse_tests(tests)
    order = sorted(range(len(tests["inputs"])), key=lambda i: len(str(tests["inputs"][i])), reverse=True)[:max_tests]
    name = tests.get("fn_name")
    if name:
        program = code + _CALL_HARNESS.format(name=str(name))
        cases = [(json.dumps(tests["inputs"][i]), json.dumps(tests["outputs"][i])) for i in order]
        compare = _json_equal
    else:
        program = code
        cases = [(_text(tests["inputs"][i]), _text(tests["outputs"][i])) for i in order]
        compare = None
    if sandbox is None:
        from gem_core.tools.sandbox import PythonSandbox

        sandbox = PythonSandbox()
    kwargs = {"time_limit_s": time_limit_s}
    if compare is not None:
        kwargs["compare"] = compare
    run = sandbox.run_tests(program, cases, **kwargs)
    grade = CodeGrade(code, passed=sum(case.passed for case in run.cases), total=len(cases), error=run.error, sandbox_failed=run.sandbox_failed)
    first = run.first_failure
    if first is not None:
        case = run.cases[first]
        grade.failure = {
            "case": order[first],
            "verdict": case.verdict,
            "input": echo(cases[first][0]),
            "expected": echo(cases[first][1]),
            "got": echo(case.stdout),
            "stderr": echo(case.stderr.strip().splitlines()[-1] if case.stderr.strip() else ""),
        }
    return grade


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(map(str, value))
    return str(value)
