"""Hostile snippets for a Python tool, shared by the security tests and ``benchmarks/python_tool.py``.

Each :class:`Hostile` has the attack (``code``, with placeholders for the host's canary paths and
ports), ``breached``, which says from the tool's output text and the host's side what got through
(``None`` when nothing did -- it works on any tool's text, so the benchmark can judge gem-llm's
tool too), and ``check``, the stricter assertions the gem-core tests make on an ExecutionResult.
``destructive`` marks attacks that would damage the machine if a tool ran them without isolation
(kill every process, mount over /tmp, exhaust memory): the benchmark does not run those on a peer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET = "canary-secret-7f3a9c"
FILE_SECRET = "canary-file-content-51d2e8"
SECRET_VAR = "GEM_CANARY_SECRET"
LEAK_FILE = "/tmp/gem_hostile_leak"
FILL_FILES = "/tmp/gem_hostile_fill"


@dataclass
class Host:
    """What the snippets attack, on the host side."""

    canary_dir: Path
    canary_file: Path
    tcp_port: int
    tcp_hits: list[str]
    udp_port: int
    udp_hits: list[bytes]
    host_pid: int

    def fill(self, code: str) -> str:
        """``code`` with its placeholders replaced by this host's values."""
        return (
            code.replace("CANARY_FILE", str(self.canary_file))
            .replace("CANARY_DIR", str(self.canary_dir))
            .replace("TCP_PORT", str(self.tcp_port))
            .replace("UDP_PORT", str(self.udp_port))
            .replace("HOST_PID", str(self.host_pid))
        )


def _serve_tcp(hits: list[str]) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def accept() -> None:
        while True:
            try:
                conn, addr = server.accept()
            except OSError:
                return
            hits.append(str(addr))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return server


def _serve_udp(hits: list[bytes]) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))

    def receive() -> None:
        while True:
            try:
                data, _ = server.recvfrom(4096)
            except OSError:
                return
            hits.append(data)

    threading.Thread(target=receive, daemon=True).start()
    return server


@contextlib.contextmanager
def hostile_host() -> Iterator[Host]:
    """A canary file, a canary env var and two loopback servers, for as long as the block runs.

    Start the tool under test inside the block: the canary variable must be in the environment the
    tool could inherit.
    """
    canary_dir = Path(tempfile.mkdtemp(prefix="gem-canary-"))
    canary_file = canary_dir / "canary.txt"
    canary_file.write_text(FILE_SECRET)
    tcp_hits: list[str] = []
    udp_hits: list[bytes] = []
    tcp, udp = _serve_tcp(tcp_hits), _serve_udp(udp_hits)
    old = os.environ.get(SECRET_VAR)
    os.environ[SECRET_VAR] = SECRET
    try:
        yield Host(canary_dir, canary_file, tcp.getsockname()[1], tcp_hits, udp.getsockname()[1], udp_hits, os.getpid())
    finally:
        if old is None:
            os.environ.pop(SECRET_VAR, None)
        else:
            os.environ[SECRET_VAR] = old
        tcp.close()
        udp.close()
        shutil.rmtree(canary_dir, ignore_errors=True)
        clean_host_leftovers()


def clean_host_leftovers() -> None:
    """Remove what a non-isolating tool may have left on the host."""
    for path in [Path(LEAK_FILE), *Path(FILL_FILES).parent.glob(Path(FILL_FILES).name + "*")]:
        with contextlib.suppress(OSError):
            path.unlink()


Check = Callable[[Any, Host], None]
Breach = Callable[[str, Host], "str | None"]


@dataclass
class Hostile:
    """One attack: its code, how to tell from outside that it got through, and gem-core's checks."""

    name: str
    code: str
    breached: Breach
    check: Check
    destructive: bool = False
    slow: bool = False  # runs until the timeout (loops, sleeps)


HOSTILE: list[Hostile] = []


def hostile(name: str, code: str, breached: Breach, *, destructive: bool = False, slow: bool = False) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        HOSTILE.append(Hostile(name, code, breached, check, destructive, slow))
        return check

    return register


def _if(condition: bool, what: str) -> str | None:
    return what if condition else None


def _leaked(text: str) -> bool:
    return SECRET in text or FILE_SECRET in text


# -- files -----------------------------------------------------------------------------------------


@hostile(
    "read a canary file outside the sandbox",
    "print(open('CANARY_FILE').read())",
    lambda t, h: _if(_leaked(t), "read the canary file"),
)
def _(r, host):
    assert r.exit_code == 1 and ("FileNotFoundError" in r.stderr or "PermissionError" in r.stderr)


@hostile(
    "list the canary dir and the home dirs",
    "import os\nfor p in ['CANARY_DIR', '/root', '/home', '/work']:\n"
    "    try: print(p, os.listdir(p))\n    except OSError as e: print(p, 'denied', type(e).__name__)",
    lambda t, h: _if("canary.txt" in t, "listed the host's canary dir"),
)
def _(r, host):
    assert f"{host.canary_dir} denied" in r.stdout


@hostile(
    "read /etc/shadow and /etc/passwd",
    "for p in ['/etc/shadow', '/etc/passwd']:\n    try: print(open(p).read()[:40])\n    except OSError as e: print('denied', p)",
    lambda t, h: _if("root:" in t, "read the host's /etc/passwd or /etc/shadow"),
)
def _(r, host):
    assert r.stdout.count("denied") == 2


@hostile(
    "write into a host dir (the canary dir)",
    "open('CANARY_DIR/pwned', 'w').write('x')\nprint('WROTE')",
    lambda t, h: _if((h.canary_dir / "pwned").exists(), "created a file in a host dir"),
)
def _(r, host):
    assert r.exit_code == 1 and "WROTE" not in r.stdout


@hostile(
    "write outside the temp dir (/usr, /, /etc, /bin)",
    "ok = []\nfor p in ['/usr/gem_pwned', '/gem_pwned', '/etc/gem_pwned', '/bin/gem_pwned']:\n"
    "    try:\n        open(p, 'w').write('x'); ok.append(p)\n    except OSError:\n        pass\nprint('WROTE', ok)",
    lambda t, h: _if("WROTE [" in t and "WROTE []" not in t, "wrote into system directories"),
    destructive=True,
)
def _(r, host):
    assert "WROTE []" in r.stdout
    assert not Path("/usr/gem_pwned").exists() and not Path("/gem_pwned").exists()


@hostile(
    "leave a file in /tmp for the next call",
    f"open('{LEAK_FILE}', 'w').write('state')\nprint('LEFT')",
    lambda t, h: _if(Path(LEAK_FILE).exists(), "left a file in the host's /tmp"),
)
def _(r, host):
    assert r.ok and not Path(LEAK_FILE).exists()


@hostile(
    "fill the disk: a huge file, then files beyond the temp space",
    "import os\ntry:\n    open('big', 'wb').write(b'x' * 200 * 1024 ** 2); print('big written')\nexcept OSError as e:\n    print('big', e.errno)\n"
    f"try:\n    for i in range(8):\n        open(f'{FILL_FILES}{{i}}', 'wb').write(b'x' * 15 * 1024 ** 2)\n    print('all written')\n"
    "except OSError as e:\n    print('many', e.errno)",
    lambda t, h: _if("big written" in t or "all written" in t, "wrote 200 MB / 120 MB of files"),
)
def _(r, host):
    assert "big 27" in r.stdout  # EFBIG: the file-size rlimit
    assert "many 28" in r.stdout  # ENOSPC: the size-capped tmpfs


# -- network ---------------------------------------------------------------------------------------


@hostile(
    "TCP connect to a server the test runs on loopback",
    "import socket\ntry:\n    socket.create_connection(('127.0.0.1', TCP_PORT), timeout=1); print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)",
    lambda t, h: _if(bool(h.tcp_hits) or "CONNECTED" in t, "connected to the host's loopback server"),
)
def _(r, host):
    assert "blocked" in r.stdout and host.tcp_hits == []


@hostile(
    "UDP datagram to a server the test runs on loopback",
    "import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "try:\n    s.sendto(b'leak', ('127.0.0.1', UDP_PORT)); print('sent')\nexcept OSError as e:\n    print('blocked', e)\ntime.sleep(0.2)",
    lambda t, h: _if(bool(h.udp_hits), "reached the host's loopback UDP server"),
)
def _(r, host):
    assert host.udp_hits == []


@hostile(
    "network interfaces",
    "print(open('/proc/net/dev').read())",
    lambda t, h: _if(
        [ln.split(":")[0].strip() for ln in t.splitlines() if ":" in ln and "|" not in ln and "Code execution" not in ln] != ["lo"],
        "sees the host's network interfaces",
    ),
)
def _(r, host):
    names = [line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line and "|" not in line]
    assert names == ["lo"]
    assert " 0 " in r.stdout.splitlines()[2]  # nothing ever went through it


# -- processes and resources -----------------------------------------------------------------------


@hostile(
    "fork bomb",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    lambda t, h: None,
    destructive=True,
    slow=True,
)
def _(r, host):
    assert r.timed_out or r.error


@hostile(
    "memory bomb: one 8 GiB allocation",
    "x = bytearray(8 * 1024 ** 3)\nprint('ALLOCATED')",
    lambda t, h: _if("ALLOCATED" in t, "allocated 8 GiB"),
    destructive=True,
)
def _(r, host):
    assert "MemoryError" in r.stderr and "ALLOCATED" not in r.stdout


@hostile(
    "memory bomb: a list that grows until it fails",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 ** 2))",
    lambda t, h: None,
    destructive=True,
)
def _(r, host):
    assert "MemoryError" in r.stderr or r.signal is not None


@hostile(
    "thread bomb",
    "import threading, time\nn = 0\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
    "except RuntimeError as e:\n    print('stopped at', n)",
    lambda t, h: None,
    destructive=True,
)
def _(r, host):
    assert "stopped at" in r.stdout and int(r.stdout.split()[-1]) < 64


@hostile("infinite loop", "while True:\n    pass", lambda t, h: None, slow=True)
def _(r, host):
    assert r.timed_out and r.signal == 9


@hostile(
    "sleep past the timeout",
    "import time\ntime.sleep(60)\nprint('WOKE')",
    lambda t, h: _if("WOKE" in t, "slept past its timeout"),
    slow=True,
)
def _(r, host):
    assert r.timed_out and "WOKE" not in r.stdout


@hostile(
    "kill the parent, every process it may, and init",
    "import os, signal\nfor target in (os.getppid(), -1, 1):\n    try:\n        os.kill(target, signal.SIGKILL); print('killed', target)\n"
    "    except OSError as e:\n        print('denied', target, e.errno)",
    lambda t, h: None,
    destructive=True,
)
def _(r, host):
    # Either the worker is out of reach (root host: another uid) or it died and was replaced.
    assert r.exit_code == 0 or r.error


@hostile(
    "signal the host process by its pid",
    "import os\ntry:\n    os.kill(HOST_PID, 9); print('KILLED HOST')\nexcept OSError as e:\n    print('denied', e)",
    lambda t, h: _if("KILLED HOST" in t, "killed the host process"),
    destructive=True,
)
def _(r, host):
    assert "KILLED HOST" not in r.stdout


@hostile(
    "leave a background process behind",
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(3600)\n    os._exit(0)\nprint('spawned')",
    lambda t, h: None,
    destructive=True,
)
def _(r, host):
    assert r.ok  # that it is gone is checked by the state tests


# -- secrets and snooping --------------------------------------------------------------------------


@hostile(
    "read the parent's environment (a canary secret)",
    "import os\nprint(dict(os.environ))\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
    "        try: print(pid, open(f'/proc/{pid}/environ', 'rb').read()[:4000])\n        except OSError as e: print(pid, 'denied')",
    lambda t, h: _if(SECRET_VAR in t or SECRET in t, "read the canary secret from an environment"),
)
def _(r, host):
    assert SECRET_VAR not in r.stdout


@hostile(
    "/proc snooping: processes and their command lines",
    "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint('PIDS', len(pids))\n"
    "for p in pids[:200]:\n    try: print(open(f'/proc/{p}/cmdline', 'rb').read()[:60])\n    except OSError: pass",
    lambda t, h: _if("PIDS " in t and int(t.split("PIDS ")[1].split()[0]) > 5, "sees the host's processes"),
)
def _(r, host):
    # bwrap's init, the worker's manager, this snippet
    assert int(r.stdout.split("PIDS ")[1].split()[0]) <= 3


@hostile(
    "open the worker's memory (/proc/PPID/mem)",
    "import os\ntry:\n    f = open(f'/proc/{os.getppid()}/mem', 'rb'); print('OPENED')\nexcept OSError as e:\n    print('denied', e.errno)",
    lambda t, h: _if("OPENED" in t, "opened its parent's memory"),
)
def _(r, host):
    assert "denied" in r.stdout


@hostile(
    "become root, make a user namespace, mount",
    "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "try:\n    os.setuid(0); print('ROOT')\nexcept OSError:\n    print('setuid denied')\n"
    "print('unshare', libc.unshare(0x10000000))\n"
    "print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))",
    lambda t, h: _if("ROOT" in t or "unshare 0" in t or "mount 0" in t, "gained privileges"),
    destructive=True,
)
def _(r, host):
    assert "setuid denied" in r.stdout and "unshare -1" in r.stdout and "mount -1" in r.stdout


@hostile(
    "devices and kernel interfaces",
    "for p in ['/dev/mem', '/dev/sda', '/dev/vda', '/proc/kcore', '/sys/kernel/notes']:\n"
    "    try:\n        open(p, 'rb').read(1); print('READ', p)\n    except OSError:\n        print('denied', p)",
    lambda t, h: _if("READ" in t, "read a device or kernel interface"),
)
def _(r, host):
    assert "READ" not in r.stdout


@hostile(
    "escape through a shell",
    "import subprocess\nr = subprocess.run(['sh', '-c', 'cat CANARY_FILE; ls /root'], capture_output=True, text=True)\nprint(r.returncode, r.stdout, r.stderr)",
    lambda t, h: _if(FILE_SECRET in t, "read the canary file through a shell"),
)
def _(r, host):
    assert FILE_SECRET not in r.stdout


# -- output and protocol ---------------------------------------------------------------------------


@hostile(
    "huge output on stdout (64 MiB)",
    "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * 65536)",
    lambda t, h: _if(len(t) > 1024 * 1024, f"returned {len(t) / 2**20:.0f} MiB of output uncut"),
)
def _(r, host):
    assert r.truncated and len(r.stdout) <= 4096 and "truncated" in r.output(4096)


@hostile(
    "huge output on stderr (10 MB)",
    "import sys\nsys.stderr.write('e' * 10_000_000)",
    lambda t, h: _if(len(t) > 1024 * 1024, f"returned {len(t) / 2**20:.0f} MiB of output uncut"),
)
def _(r, host):
    assert r.truncated and len(r.stdout + r.stderr) <= 4096


@hostile(
    "write garbage to every inherited file descriptor",
    "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b'\\xff' * 64)\n    except OSError: pass\nprint('done')",
    lambda t, h: None,
)
def _(r, host):
    assert r.error is None  # the worker's control pipe is not among them


@hostile(
    "close stdout and stderr, then spin",
    "import os\nos.close(1)\nos.close(2)\nwhile True: pass",
    lambda t, h: None,
    slow=True,
)
def _(r, host):
    assert r.timed_out
