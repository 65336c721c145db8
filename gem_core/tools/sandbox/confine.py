"""Confine the calling process (and everything it starts) so it cannot reach the processes that judge
it. Standard library only: the sandbox's programs (the Python tool's worker, the Terminal env's
supervisor) load this file inside bubblewrap, where gem_core is not importable.

``confine()`` puts the caller into a new Landlock domain and a seccomp filter, both inherited by every
child and kept across ``execve``:

* **Landlock** (Linux 5.13+): a process inside a domain cannot ptrace, open ``/proc/PID/mem`` or
  ``/proc/PID/fd/N`` of, or ``process_vm_readv/writev`` into, a process outside that domain (or in a
  less restricted one), whatever their uids; from Landlock ABI 6 (Linux 6.12) it cannot signal one
  either, nor connect to an abstract Unix socket made outside it. A second ``confine()`` nests a new
  domain: its processes cannot reach those of the outer one. The ruleset restricts no file access
  beyond making block devices (which the sandbox has none of), so commands work as before.
* **seccomp**: ``ptrace``, ``process_vm_readv`` and ``process_vm_writev`` fail with EPERM (and, on
  x86_64, every x32 and 32-bit system call): the part of the above that holds without Landlock.
  ``/proc/PID/mem`` is not a system call, so without Landlock it is guarded only by ``PR_SET_DUMPABLE``
  (the sandbox's supervisors set it) and uids.

``no_new_privs`` is set first (bubblewrap sets it too): nothing after it can gain privileges by exec.

Run as a program (``python -I -S confine.py COMMAND ARGS...``), it confines itself and execs
``COMMAND``: the Terminal env's checkers run the agent's scripts through it.
"""

import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
# Landlock (<linux/landlock.h>): the same numbers on every architecture (syscalls 444 and 446).
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1, 2
# seccomp (<linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>) and the syscall numbers it denies.
ARCHES = {
    # machine: (AUDIT_ARCH_*, {name: number}, lowest number of another ABI sharing this arch, or None)
    "x86_64": (0xC000003E, {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311}, 0x40000000),
    "aarch64": (0xC00000B7, {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271}, None),
}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM = 1
SECCOMP_DATA_NR, SECCOMP_DATA_ARCH = 0, 4

_libc = ctypes.CDLL(None, use_errno=True)


def landlock_abi():
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, version)


def _landlock(abi):
    """A new Landlock domain for the caller; False when the kernel has none to give."""
    if abi < 1:
        return False
    # struct landlock_ruleset_attr: handled_access_fs, then handled_access_net (ABI 4), then scoped (ABI 6).
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL
    attr = struct.pack("=QQQ", LANDLOCK_ACCESS_FS_MAKE_BLOCK, 0, scoped) if abi >= 6 else struct.pack("=Q", LANDLOCK_ACCESS_FS_MAKE_BLOCK)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return False
    try:
        return _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
    finally:
        os.close(fd)


def _filter():
    """The seccomp program (struct sock_filter array bytes), or None on an architecture not listed."""
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, numbers, other_abi = arch
    deny = sorted(numbers.values())

    def op(code, k, jt=0, jf=0):
        return struct.pack("=HBBI", code, jt, jf, k)

    errno = op(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM)
    allow = op(BPF_RET_K, SECCOMP_RET_ALLOW)
    # Layout: [load arch][arch == ours? else errno][load nr][other ABI? errno][nr == each? errno]... allow, errno
    body = [op(BPF_LD_W_ABS, SECCOMP_DATA_NR)]
    checks = ([(BPF_JGE_K, other_abi)] if other_abi is not None else []) + [(BPF_JEQ_K, n) for n in deny]
    for index, (code, k) in enumerate(checks):
        to_errno = len(checks) - index  # the instructions left after this one, up to and including "allow"
        body.append(op(code, k, jt=to_errno, jf=0))
    program = [op(BPF_LD_W_ABS, SECCOMP_DATA_ARCH), op(BPF_JEQ_K, audit_arch, jt=0, jf=len(body) + 1)]
    program += body + [allow, errno]
    return b"".join(program)


def _seccomp():
    program = _filter()
    if program is None:
        return False
    filters = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(filters))
    return _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def confine():
    """Confine the caller (see the module docstring). ``(landlock, seccomp)``: which of the two took."""
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return _landlock(landlock_abi()), _seccomp()


def main(argv):
    if not argv:
        sys.stderr.write("usage: confine.py COMMAND [ARGS...]\n")
        return 2
    confine()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
