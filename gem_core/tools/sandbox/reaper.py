"""The reaper: no sandbox process or temp dir outlives the process that owns it. Standard library only.

bubblewrap's ``--die-with-parent`` binds a sandbox to its owner only once bwrap has armed it, and only
for the outer bwrap: bwrap arms it after it cloned the sandbox's init (pid 1 of the new pid namespace),
which first waits for the outer bwrap's go-ahead. An owner that dies in that window (SIGKILL, ``ray.kill``
of its actor, Ray killing a dead worker's children) takes the outer bwrap with it and strands the init:
alive for good, reparented to the host's init, no worker under it, deaf to SIGTERM (a namespace init
ignores every signal but SIGKILL from outside). So every owner process also has one reaper: a small
daemon (double-forked, so that nothing that kills the owner's children kills it) holding the read end of
a pipe whose only write end is the owner's. When the owner is gone, however it ended, the read sees
end-of-file and the reaper SIGKILLs every process whose command line carries the owner's tag (bwrap,
the sandbox's init, the worker, its children; each one's process group too when that group is theirs)
until none is left, then removes the owner's temp dirs (``isolation="none"`` workers), and exits.

The tag is in every worker's command line (the worker's config): ``gem-sandbox-owner=LABEL/PID/NONCE/N``.
``LABEL`` is ``GEM_SANDBOX_LABEL`` (empty by default): a run that sets it can find what it left behind
(:func:`find_processes`, :func:`find_temp_dirs`, :func:`find_reapers`), as the test suite does at its end.

Run as ``python -I -S reaper.py --gem-sandbox-reaper LABEL PID NONCE TMPDIR`` with the pipe on stdin.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import time

TAG = "gem-sandbox-owner="  # then LABEL/PID/NONCE (the owner), then /N (one worker)
REAPER_FLAG = "--gem-sandbox-reaper"
TEMP_PREFIX = "gem-pysandbox-"  # then LABEL-PID-NONCE- (an isolation="none" worker's host temp dir)
LABEL_VAR = "GEM_SANDBOX_LABEL"
LABEL_PATTERN = re.compile(r"[A-Za-z0-9_.-]{0,64}")
SWEEP_ROUNDS = 200  # kill-and-look rounds before the reaper gives up
SWEEP_PAUSE_S = 0.02
# Looks that must find nothing in a row: a process in the middle of its exec shows no command line for
# a moment (the kernel fills it in after the exec's parent has been told it succeeded).
QUIET_ROUNDS = 3


def owner_tag(label: str, pid: int, nonce: str) -> str:
    """The tag of one owner process's sandboxes (a worker's tag adds ``/N``)."""
    return f"{TAG}{label}/{pid}/{nonce}"


def temp_prefix(label: str, pid: int, nonce: str) -> str:
    """The name prefix of one owner's host temp dirs."""
    return f"{TEMP_PREFIX}{label}-{pid}-{nonce}-"


def check_label(label: str) -> str:
    """``label`` if it is a valid :data:`LABEL_VAR` value (it goes into command lines and file names)."""
    if not LABEL_PATTERN.fullmatch(label):
        raise ValueError(f"{LABEL_VAR} must be at most 64 of A-Z a-z 0-9 _ . -, got {label!r}")
    return label


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def command_line(pid: int, limit: int = 200) -> str:
    """``pid``'s command line as text (at most ``limit`` characters), or "(gone)": for reports of leftovers."""
    line = _cmdline(pid)
    return line.replace(b"\0", b" ").decode(errors="replace")[:limit] if line else "(gone)"


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[2])  # after the name: state, parent, process group


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def find_processes(marker: str = TAG) -> list[int]:
    """Living (not zombie) processes whose command line holds ``marker``: by default every sandbox
    process of every owner; ``owner_tag(...) + "/"`` one owner's; ``TAG + label + "/"`` one label's."""
    wanted, me = marker.encode(), os.getpid()
    found = []
    for pid in _pids():
        if pid != me and wanted in _cmdline(pid):
            stat = _stat(pid)
            if stat is not None and stat[0] != "Z":
                found.append(pid)
    return found


def find_reapers(label: str | None = None) -> dict[int, int]:
    """Living reapers (of ``label``, or of every label): reaper pid -> owner pid."""
    flag = REAPER_FLAG.encode() + b"\0"
    found = {}
    for pid in _pids():
        line = _cmdline(pid)
        if flag in line:
            args = line.split(flag, 1)[1].split(b"\0")
            if len(args) >= 2 and (label is None or args[0].decode() == label):
                stat = _stat(pid)
                if stat is not None and stat[0] != "Z":
                    found[pid] = int(args[1])
    return found


def find_temp_dirs(label: str | None = None, root: str | None = None) -> list[str]:
    """Host temp dirs of ``isolation="none"`` workers (of ``label``, or of every label) under ``root``."""
    import tempfile

    root = root or tempfile.gettempdir()
    prefix = TEMP_PREFIX + ("" if label is None else f"{label}-")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted(os.path.join(root, n) for n in names if n.startswith(prefix) and os.path.isdir(os.path.join(root, n)))


def kill_tagged(marker: str, rounds: int = SWEEP_ROUNDS, pause: float = SWEEP_PAUSE_S) -> bool:
    """SIGKILL every process whose command line holds ``marker`` (and its process group, when the
    group's leader holds it too) until none is left; True when none is. SIGKILL from the host reaches
    a namespace init too, and ends its whole namespace."""
    wanted, own_group = marker.encode(), os.getpgid(0)
    quiet = 0
    for _ in range(rounds):
        pids = find_processes(marker)
        quiet = 0 if pids else quiet + 1
        if quiet >= QUIET_ROUNDS:
            return True
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if wanted not in _cmdline(pid):  # the pid was reused since it was listed
                    continue
                stat = _stat(pid)
                group = stat[1] if stat else -1
                if group > 1 and group != own_group and wanted in _cmdline(group):
                    with contextlib.suppress(OSError):
                        os.killpg(group, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)
        time.sleep(pause)
    return not find_processes(marker)


def remove_temp_dirs(root: str, prefix: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def reap(label: str, owner: int, nonce: str, root: str) -> bool:
    """What the reaper does once its owner is gone (also on SIGTERM): kill, then remove the temp dirs."""
    done = kill_tagged(owner_tag(label, owner, nonce) + "/")
    remove_temp_dirs(root, temp_prefix(label, owner, nonce))
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 6 or argv[1] != REAPER_FLAG:
        sys.stderr.write(f"usage: reaper.py {REAPER_FLAG} LABEL OWNER_PID NONCE TMPDIR (lifeline on stdin)\n")
        return 2
    label, owner, nonce, root = argv[2], int(argv[3]), argv[4], argv[5]
    if os.fork():  # the owner waits for this one; the reaper lives on, nobody's child but init's
        os._exit(0)
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)

    def on_term(signum: int, frame: object) -> None:
        reap(label, owner, nonce, root)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        try:
            if not os.read(0, 4096):  # end of file: the owner's write end is closed, so the owner is gone
                break
        except InterruptedError:
            continue
        except OSError:
            break
    return 0 if reap(label, owner, nonce, root) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
