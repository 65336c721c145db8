"""A few coding problems with tests, made by gem_core (stdin/stdout and function-call styles), each with a
reference solution: what tests and examples feed the ``data_files=`` path of the code ids."""

from __future__ import annotations

import json
from typing import Any

PROBLEMS: list[dict[str, Any]] = [
    {
        "problem": "Read two integers a and b on one line and print a + b.",
        "tests": {"inputs": ["1 2\n", "-5 5\n", "100 23\n"], "outputs": ["3\n", "0\n", "123\n"]},
        "solution": "a, b = map(int, input().split())\nprint(a + b)",
    },
    {
        "problem": "Read a line of text and print it reversed.",
        "tests": {"inputs": ["hello\n", "abc\n", "x\n"], "outputs": ["olleh\n", "cba\n", "x\n"]},
        "solution": "print(input()[::-1])",
    },
    {
        "problem": "Read n, then n integers on the next line; print the largest.",
        "tests": {"inputs": ["3\n1 9 4\n", "1\n-7\n", "4\n2 2 2 3\n"], "outputs": ["9\n", "-7\n", "3\n"]},
        "solution": "input()\nprint(max(map(int, input().split())))",
    },
    {
        "problem": "Define a function add(a, b) that returns a + b.",
        "tests": {"fn_name": "add", "inputs": [[1, 2], [-1, 1], [10, 5]], "outputs": [[3], [0], [15]]},
        "solution": "def add(a, b):\n    return a + b",
    },
    {
        "problem": "Define a function is_palindrome(s) that returns whether the string s reads the same backwards.",
        "tests": {"fn_name": "is_palindrome", "inputs": [["abba"], ["abc"], [""]], "outputs": [True, False, True]},
        "solution": "class Solution:\n    def is_palindrome(self, s):\n        return s == s[::-1]",
    },
]


def code_rows(n: int | None = None) -> list[dict[str, Any]]:
    """The problems as dataset rows (``problem``, ``tests`` as JSON text, ``solution``), cycled to ``n``."""
    n = len(PROBLEMS) if n is None else n
    return [{"problem": p["problem"], "tests": json.dumps(p["tests"]), "solution": p["solution"]} for p in (PROBLEMS[i % len(PROBLEMS)] for i in range(n))]
