"""A math-grading worker process (run as a script, `python -I`, by :mod:`gem_core.grading.pool`; imports no gem_core).

Reads one JSON request per line on stdin -- ``{"g": [gold, ...], "a": answer}`` -- and writes one
line per request on stdout: ``1`` (equivalent to some gold answer), ``0`` (not) or ``e <message>``.
math-verify runs with its own timeouts off (they use SIGALRM): the parent process kills a worker that
takes longer than the answer's time limit and starts a new one.
"""

import json
import logging
import os
import sys


def main() -> None:
    logging.disable(logging.CRITICAL)  # math-verify warns once that its timeouts are off: we time it out
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = (LatexExtractionConfig(), ExprExtractionConfig())
    gold_cache: dict[str, list] = {}

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=config, parsing_timeout=None)

    def equivalent(golds: list, answer: str) -> bool:
        target = parsed(answer)
        if not target:
            return False
        for gold in golds:
            gold_parsed = gold_cache.get(gold)
            if gold_parsed is None:
                gold_parsed = parsed(gold)
                if len(gold_cache) > 4096:
                    gold_cache.clear()
                gold_cache[gold] = gold_parsed
            if gold_parsed and verify(gold_parsed, target, timeout_seconds=None):
                return True
        return False

    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    read = sys.stdin.buffer.readline
    while True:
        line = read()
        if not line:
            return
        try:
            request = json.loads(line)
            reply = b"1\n" if equivalent(request["g"], request["a"]) else b"0\n"
        except Exception as exc:  # a bad request or a math-verify bug: the verdict is an error, the worker lives
            reply = ("e " + repr(exc)[:200].replace("\n", " ") + "\n").encode()
        out.write(reply)
        out.flush()


if __name__ == "__main__":
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
