"""The isolation policy: what a sandboxed worker can see and do, as a bubblewrap command line.

* new user, pid, network, IPC, UTS and cgroup namespaces: no network at all (not even the host's
  loopback), a fresh ``/proc`` that shows only the sandbox's own processes;
* a read-only view of ``/usr`` (and the ``/bin``, ``/lib*`` links), of the Python installation and
  of the worker's own source; nothing else of the host's files (no home, no project, no ``/etc``
  beyond the loader cache);
* a size-capped private ``/tmp`` and ``/dev/shm``, wiped by the worker after every call;
* an empty environment (``--clearenv``) apart from :data:`SANDBOX_ENV`: host secrets are not there
  (the worker also starts with :data:`WORKER_ONLY_ENV`, which it drops before any snippet runs);
* per call, set in the snippet's process once its request arrives (``worker.set_limits``):
  RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC (processes), RLIMIT_FSIZE, RLIMIT_NOFILE and no
  core dumps; the host enforces the wall-clock timeout and the output cap.

When the host runs as root, the sandbox gets a user namespace in which snippets run as
:data:`SANDBOX_UID`, which maps to the host's ``nobody``: they are not host root, cannot signal their
worker, and the kernel enforces their process limit (it exempts uid 0 from ``RLIMIT_NPROC``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gem_core.errors import GemError

BWRAP_PACKAGE = "bubblewrap"
SANDBOX_UID = 1000  # the uid snippets have inside the sandbox
HOST_NOBODY_UID = 65534  # what SANDBOX_UID is on the host when the host runs as root
WORKER_SOURCE_DIR = Path(__file__).resolve().parent  # worker.py and protocol.py, bound read-only
WORKER_MOUNT = "/opt/gem-sandbox"  # where the sandbox sees WORKER_SOURCE_DIR
SANDBOX_TMP = "/tmp"  # the private tmpfs: the worker's scratch space and each call's cwd
EXTRA_WIPED_DIRS = ("/dev/shm", "/dev/mqueue")  # other writable places, wiped after each call
SYSTEM_DIR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # top-level dirs bound or linked
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# The worker's alone (it drops them before any snippet runs). LD_BIND_NOW: symbols resolved once at
# start-up, not lazily in each call's forked child, which would write (so copy) the linkage tables.
WORKER_ONLY_ENV = {"LD_BIND_NOW": "1"}
CLONE_NEWUSER = 0x10000000  # unshare(2) flag, from <linux/sched.h>
# A helper the host starts (as root) to own a user namespace that bwrap then joins (see below).
_USERNS_HELPER = (
    "import ctypes, os, sys\n"
    f"if ctypes.CDLL(None, use_errno=True).unshare({CLONE_NEWUSER}):\n"
    "    sys.exit('unshare(CLONE_NEWUSER) failed, errno %d' % ctypes.get_errno())\n"
    "# No nested user namespaces below this one (bwrap's --disable-userns needs --unshare-user).\n"
    "with open('/proc/sys/user/max_user_namespaces', 'w') as f:\n"
    "    f.write('0')\n"
    "os.write(1, b'ok')\n"
    "os.read(0, 1)\n"
)
MIB = 1024 * 1024


class SandboxUnavailable(GemError, RuntimeError):
    """The sandbox cannot be started here (bubblewrap missing, or namespaces not allowed)."""


def bwrap_path() -> str | None:
    """Where ``bwrap`` is, or ``None``."""
    return shutil.which("bwrap")


def require_bwrap() -> str:
    """The path of ``bwrap``; a clear error naming the Debian package when it is missing."""
    path = bwrap_path()
    if path is None:
        raise SandboxUnavailable(
            "the Python sandbox needs bubblewrap, and `bwrap` is not on PATH. Install the Debian/Ubuntu "
            f"package '{BWRAP_PACKAGE}' (apt-get install -y {BWRAP_PACKAGE}); or, only on a machine where "
            "running untrusted code unisolated is acceptable, pass isolation='none'."
        )
    return path


def sandbox_python() -> str:
    """The interpreter the sandbox starts: ``sys.executable`` with its directory resolved (a path such as
    ``repro/../.venv/bin/python`` names no directory inside the sandbox, where only the resolved
    prefixes are bound), its own name kept (a virtualenv's ``python`` is a link that must stay one)."""
    executable = sys.executable or "python3"
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(executable))), os.path.basename(executable))


def python_dirs() -> list[str]:
    """The directories the sandboxed interpreter needs: its prefixes, outside /usr, outermost only."""
    candidates = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    candidates.add(str(Path(os.path.realpath(sys.executable)).parent.parent))
    candidates.add(os.path.dirname(os.path.dirname(sandbox_python())))
    candidates = {os.path.abspath(p) for p in candidates}  # no `..` (bwrap cannot bind such a path)
    dirs = sorted({os.path.realpath(p) for p in candidates} | candidates)
    dirs = [d for d in dirs if not (d == "/usr" or d.startswith("/usr/")) and os.path.isdir(d)]
    outer: list[str] = []
    for d in dirs:
        if not any(d.startswith(o.rstrip("/") + "/") for o in outer):
            outer.append(d)
    return outer


def kept_under_tmp() -> list[str]:
    """Read-only binds that live under the sandbox's /tmp (an interpreter in /tmp): not wiped."""
    return [d for d in python_dirs() if d.startswith(SANDBOX_TMP + "/")]


def bwrap_argv(tmpfs_mb: int, userns_fd: int | None, info_fd: int | None = None, binds: Sequence[str] = (), as_pid_1: bool = False) -> list[str]:
    """The bubblewrap command line that starts a worker: everything up to the ``--`` before Python.

    ``userns_fd``: a user namespace to join (the host is root, see :func:`user_namespace_as_root`);
    otherwise bwrap makes its own and maps the caller to :data:`SANDBOX_UID`. ``info_fd``: where bwrap
    writes the host pid of the sandbox's init (``{"child-pid": N, ...}``), so the host can end it.
    ``binds``: more bwrap mount options (the Terminal env's own tmpfs and its supervisor's source),
    placed before the root is remounted read-only. ``as_pid_1``: the program is the sandbox's pid 1 (no
    bwrap init holding the host's descriptors beside it; it must reap orphans itself).
    """
    tmpfs_bytes = str(tmpfs_mb * MIB)
    argv = [require_bwrap(), "--die-with-parent", "--new-session"]
    if as_pid_1:
        argv += ["--as-pid-1"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if userns_fd is not None:
        argv += ["--userns", str(userns_fd), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        argv += ["--disable-userns"]  # no nested user namespaces: they would hand the snippet capabilities
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIR_LINKS:
        host = Path("/" + name)
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # /tmp first: an interpreter that lives under /tmp is then bound on top of it, not hidden by it.
    argv += ["--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", SANDBOX_TMP]
    made: set[str] = set()
    for d in python_dirs():
        # Parents are made world-traversable: bwrap would copy a private parent's mode (/root is 0700).
        for parent in reversed(Path(d).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", d, d]
    # /opt traversable by every uid: the agent's code is confined by WORKER_MOUNT's confine.py.
    argv += ["--perms", "0755", "--dir", str(Path(WORKER_MOUNT).parent), "--ro-bind", str(WORKER_SOURCE_DIR), WORKER_MOUNT]
    argv += list(binds)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", "/dev/shm"]
    argv += ["--mqueue", "/dev/mqueue", "--remount-ro", "/dev"]
    argv += ["--remount-ro", "/", "--clearenv"]
    for key, value in {**SANDBOX_ENV, **WORKER_ONLY_ENV, "HOME": SANDBOX_TMP, "TMPDIR": SANDBOX_TMP}.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", SANDBOX_TMP, "--"]
    return argv


def user_namespace_as_root() -> tuple[subprocess.Popen[bytes], int]:
    """A user namespace where ns-root is host root (for bwrap's set-up) and SANDBOX_UID is nobody.

    bwrap, run by root, would map the sandbox's only uid to host root; the snippet would then be
    exempt from RLIMIT_NPROC (a fork bomb could exhaust the host's pids). A helper process makes the
    namespace; we write its maps; bwrap joins it. The caller closes the fd and ends the helper.
    """
    helper = subprocess.Popen(
        [sys.executable, "-S", "-I", "-c", _USERNS_HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if helper.stdout.read(2) != b"ok":  # type: ignore[union-attr]
        err = helper.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        helper.kill()
        helper.wait()
        raise SandboxUnavailable(f"could not create a user namespace for the sandbox: {err.strip()}")
    mapping = f"0 0 1\n{SANDBOX_UID} {HOST_NOBODY_UID} 1\n"
    Path(f"/proc/{helper.pid}/uid_map").write_text(mapping)
    Path(f"/proc/{helper.pid}/gid_map").write_text(mapping)
    ns_fd = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    return helper, ns_fd
