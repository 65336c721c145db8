"""ray.kill of a SandboxService actor leaves no sandbox process: not its idle workers, not the one busy
in a call, not the one whose bwrap was still starting. The last is the case CI met: Ray kills a dead
worker's children (and bwrap's --die-with-parent fires) while bwrap holds the sandbox's init before its
go-ahead; the init then waits forever, reparented to init and deaf to SIGTERM, unless the actor's
reaper ends it (gem_core.tools.sandbox.reaper). Processes are counted by the pool's marker in /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from conftest import actor_states, alive, wait_until
from sandbox_support import held_bwrap_dir, kill_marked, marked_processes, require_bwrap, unique_marker

from gem_core.ray.services import ACTOR_CONCURRENCY, SandboxHost, SandboxService, node_affinity
from gem_core.tools.sandbox import PythonSandbox
from gem_core.tools.sandbox.host import WorkerSpec
from gem_core.tools.sandbox.pool import route_shared_pools


class HoldingSandboxHost(SandboxHost):
    """The service's actor, plus one thing for this test: start one more worker with a bwrap that holds."""

    def hold_next_start(self, spec: WorkerSpec, directory: str) -> None:
        os.environ["PATH"] = directory + os.pathsep + os.environ["PATH"]
        pool = self._pool(spec)
        pool.resize(pool.size + 1)
        threading.Thread(target=pool.start, daemon=True).start()


def _held(marker: str) -> list[int]:
    return [p for p in marked_processes(marker) if b"--userns-block-fd" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_ray_kill_of_a_sandbox_service_actor_leaves_no_process(ray_cluster, tmp_path):
    import ray

    require_bwrap()
    marker = unique_marker()
    spec = WorkerSpec(preload=(marker,))
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(HoldingSandboxHost).options(scheduling_strategy=node_affinity(node), max_concurrency=ACTOR_CONCURRENCY, num_cpus=0).remote(2)
    service = SandboxService({node: actor}, owned=True, workers=2)
    try:
        assert ray.get(actor.start.remote(spec)) == 2
        service.install()
        sandbox = PythonSandbox(preload=(marker,), timeout=60)  # its calls run in the actor
        threading.Thread(target=sandbox.run, args=("import time\ntime.sleep(60)",), daemon=True).start()
        ray.get(actor.hold_next_start.remote(spec, str(held_bwrap_dir(tmp_path / "held"))))
        assert wait_until(lambda: len(_held(marker)) == 2, 30), _held(marker)  # bwrap and its init, held
        assert wait_until(lambda: len(marked_processes(marker)) >= 2 + 2 * 3, 30)  # and two started workers
        pid = ray.get(actor.where.remote())[1]
        ray.kill(actor, no_restart=True)
        assert wait_until(lambda: actor_states().get(actor._actor_id.hex()) == "DEAD")
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 15)
        left = wait_until(lambda: marked_processes(marker) == [], 15) or marked_processes(marker)
        assert left is True, [Path(f"/proc/{p}/stat").read_text()[:60] for p in left if Path(f"/proc/{p}").exists()]
    finally:
        route_shared_pools(None)
        service.stop()
        kill_marked(marker)


def test_the_ray_run_fails_when_it_leaves_a_process_behind(tmp_path):
    """tests/ray_backend/conftest.py's check after the whole run: a process that carries the run's label in
    its environment and outlives the run's grace period fails the run (exit 1), is named, and is killed."""
    import subprocess
    import sys
    import uuid

    from gem_core.tools.sandbox import reaper

    label = f"leak-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, reaper.LABEL_VAR: label, "GEM_TEST_RAY_GRACE_S": "1", "GEM_TEST_LEFTOVER_GRACE_S": "1"}
    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "run.log"
    with open(log, "w") as out:  # a file, not a pipe: the process left behind cannot hold it open
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "tests/ray_backend/leaky_ray_session.py"],
            stdout=out, stderr=subprocess.STDOUT, timeout=300, env=env, cwd=root,
        )  # fmt: skip
    text = log.read_text()
    pid = int(text.split("LEFT ", 1)[1].split()[0])
    try:
        assert code == 1, text[-3000:]
        assert f"the ray run left processes behind (label {label})" in text and f"process {pid}:" in text, text[-3000:]
        assert wait_until(lambda: alive([pid]) == [], 5)
    finally:
        if alive([pid]):
            os.kill(pid, 9)
