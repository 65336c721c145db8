"""What the host and a sandbox worker say to each other. Standard library only: the worker imports
this file inside the sandbox, where gem_core is not importable.

Two channels:

* the **control socket** (a Unix SOCK_SEQPACKET pair: one message per send, so no framing): one
  byte naming the op, then its fields (:data:`OPS`). The worker says ``hello`` once, then ``ready``
  with the five file descriptors of the child it forked for the next call attached (SCM_RIGHTS,
  in :data:`CHILD_FDS` order). The host says ``done`` when it has what it wants from that child;
  the worker then ends it (answering ``ended`` when asked to ``report`` how), cleans up and says
  ``ready`` again, or ``unclean`` and exits.
* the **child's pipes**, which the host uses directly (a call never passes through the worker):
  the request goes in as one :data:`REQUEST` header and its payload; the output comes back on the
  stdout and stderr pipes; the exit code on the status pipe (:data:`STATUS`), written once the
  output is flushed, so the host never waits for EOF (a leftover process may hold the pipes open).
  A ``tests`` request answers on the stdout pipe with one :data:`CASE_REPORT` per case.
"""

import json
import os
import socket
import struct

# -- control messages -----------------------------------------------------------------------------

HELLO, READY, DONE, ENDED, UNCLEAN = "hello", "ready", "done", "ended", "unclean"
CHILD_FDS = ("w_req", "r_out", "r_err", "r_status", "pidfd")  # the host's ends, in this order
MAX_CONTROL_BYTES = 65536

# op -> its byte, and its fields: a struct and their names, or None for a JSON object. The three
# messages of every call are fixed structs: the worker forks a child per call, and after a fork
# each page the worker's Python writes is copied, so the per-call path keeps away from the json
# module's machinery. ``hello`` and ``unclean`` come once per worker and carry free-form fields.
OPS = {
    HELLO: (b"H", None, ()),  # pid, uid, preloaded (the modules it imported)
    READY: (b"R", struct.Struct(""), ()),
    DONE: (b"D", struct.Struct(">?"), ("report",)),  # report: answer with ``ended``
    ENDED: (b"E", struct.Struct(">ii"), ("exit_code", "signal")),  # the child's, or None
    UNCLEAN: (b"U", None, ()),  # reason
}
NONE_ON_WIRE = {"exit_code": -1, "signal": 0}  # how a struct field says None (exit codes are 0-255)
_OP_OF_BYTE = {code[0]: op for op, (code, _, _) in OPS.items()}


def send(sock, op, fds=(), **fields):
    """One control message, with file descriptors attached when given."""
    code, layout, names = OPS[op]
    if layout is None:
        body = json.dumps(fields).encode()
    else:
        body = layout.pack(*(NONE_ON_WIRE[name] if fields[name] is None else fields[name] for name in names))
    socket.send_fds(sock, [code + body], list(fds))


def receive(sock):
    """The next control message (a dict with ``op`` and its fields) and its file descriptors;
    ``(None, [])`` when the peer is gone. Raises ValueError (after closing any descriptors) for a
    message that cannot be read."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_CONTROL_BYTES, len(CHILD_FDS))
    if not data:
        _close(fds)
        return None, []
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("the message was cut")
        message = decode(data)
    except ValueError:
        _close(fds)
        raise
    return message, fds


def decode(data):
    """A control message's bytes as a dict with ``op`` and its fields; ValueError if unreadable."""
    op = _OP_OF_BYTE.get(data[0])
    if op is None:
        raise ValueError(f"not a control message: {data[:100]!r}")
    _, layout, names = OPS[op]
    if layout is None:
        fields = json.loads(data[1:])  # a JSONDecodeError is a ValueError
        if not isinstance(fields, dict):
            raise ValueError(f"the fields of {op!r} are not an object: {data[:100]!r}")
        return {**fields, "op": op}
    if len(data) - 1 != layout.size:
        raise ValueError(f"{op!r} came with {len(data) - 1} bytes of fields, not {layout.size}")
    message = {"op": op}
    for name, value in zip(names, layout.unpack(data[1:])):
        message[name] = None if NONE_ON_WIRE.get(name) == value else value
    return message


def _close(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# -- the request on the child's pipe --------------------------------------------------------------

MODE_RUN = 0  # run the code once, its streams are the child's pipes; payload: stdin bytes
MODE_TESTS = 1  # run the code once per case, each in its own process; payload: JSON list of stdins
NO_LIMIT = 0  # in a byte-count field of REQUEST: unlimited

# mode, code bytes, payload bytes, CPU seconds, address space bytes, file size bytes, processes,
# open files, output bytes (per case in tests mode), time limit per case (ms, tests mode)
REQUEST = struct.Struct(">BIIIqqIIII")


def encode_request(mode, code, payload, cpu_seconds, memory_bytes, file_bytes, processes, open_files, output_bytes, case_ms=0):
    """The bytes the host writes to a child's request pipe (``code`` a str, ``payload`` bytes)."""
    body = code.encode("utf-8", "surrogatepass")  # a lone surrogate reaches compile(), which reports it
    head = REQUEST.pack(
        mode, len(body), len(payload), cpu_seconds, memory_bytes or NO_LIMIT, file_bytes or NO_LIMIT,
        processes, open_files, output_bytes, case_ms,
    )  # fmt: skip
    return head + body + payload


def decode_request_head(head):
    """The fields of a REQUEST header, as a dict."""
    names = ("mode", "code_bytes", "payload_bytes", "cpu_seconds", "memory_bytes", "file_bytes", "processes",
             "open_files", "output_bytes", "case_ms")  # fmt: skip
    return dict(zip(names, REQUEST.unpack(head)))


# -- what comes back ------------------------------------------------------------------------------

STATUS = struct.Struct(">i")  # the child's exit code, on the status pipe
# per case: exit code (or -1), signal (or 0), timed out, truncated, seconds, stdout bytes, stderr bytes
CASE_REPORT = struct.Struct(">iiBBdII")
NO_EXIT_CODE = -1  # a case killed by a signal has no exit code


def encode_case(exit_code, signal, timed_out, truncated, duration, stdout, stderr):
    """One case's report: the header, then its stdout and stderr bytes."""
    code = NO_EXIT_CODE if exit_code is None else exit_code
    head = CASE_REPORT.pack(code, signal or 0, timed_out, truncated, duration, len(stdout), len(stderr))
    return head + stdout + stderr


def decode_cases(data):
    """The case reports in ``data`` (as dicts), in order; stops at a report that is cut short."""
    cases, at = [], 0
    while at + CASE_REPORT.size <= len(data):
        code, sig, timed_out, truncated, duration, n_out, n_err = CASE_REPORT.unpack_from(data, at)
        at += CASE_REPORT.size
        if at + n_out + n_err > len(data):
            break
        stdout, stderr = data[at : at + n_out], data[at + n_out : at + n_out + n_err]
        at += n_out + n_err
        cases.append(
            {
                "exit_code": None if code == NO_EXIT_CODE else code,
                "signal": sig or None,
                "timed_out": bool(timed_out),
                "truncated": bool(truncated),
                "duration": duration,
                "stdout": stdout,
                "stderr": stderr,
            }
        )
    return cases


READ_CHUNK = 65536  # bytes per read of a snippet's or a case's output


def read_some(fd: int, buffer: bytearray) -> bool:
    """Append what the non-blocking ``fd`` has now to ``buffer``; False at EOF or when nothing is there.
    (Used on both sides: the host reads a snippet's output, the worker a test case's.)"""
    try:
        data = os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return False
    buffer += data
    return bool(data)
