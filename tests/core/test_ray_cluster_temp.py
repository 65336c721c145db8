"""gem_core.ray.cluster's temp folder for a local cluster (no Ray needed): Ray's own where its sockets fit, a
short one of its own where they do not (a Unix socket's path holds 107 bytes)."""

from __future__ import annotations

import os

from gem_core.ray.cluster import RAY_SOCKET_TAIL, UNIX_SOCKET_PATH_MAX, local_temp_dir, ray_temp_dir_arg


def test_ray_keeps_its_own_temp_folder_where_its_sockets_fit():
    assert local_temp_dir({"RAY_TMPDIR": "/tmp"}) is None
    assert ray_temp_dir_arg(None) == {}


def test_a_long_temp_folder_gets_a_short_one_of_its_own():
    long = "/home/alice/" + "a" * 60 + "/.nox/roll_src_real/tmp"
    assert len(long) + RAY_SOCKET_TAIL > UNIX_SOCKET_PATH_MAX
    short = local_temp_dir({"RAY_TMPDIR": long})
    try:
        assert short is not None and os.path.isdir(short)
        assert len(short) + RAY_SOCKET_TAIL <= UNIX_SOCKET_PATH_MAX
        assert ray_temp_dir_arg(short) == {"_temp_dir": short}
    finally:
        os.rmdir(short)
