"""The control messages between the host and a sandbox worker: what is sent is what arrives, file
descriptors included, and a message that cannot be read is a ValueError, never a wrong dict."""

from __future__ import annotations

import os
import socket

import pytest

from gem_core.tools.sandbox import protocol


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        (protocol.HELLO, {"pid": 12, "uid": 1000, "preloaded": ["math", "re"]}),
        (protocol.READY, {}),
        (protocol.DONE, {"report": True}),
        (protocol.DONE, {"report": False}),
        (protocol.ENDED, {"exit_code": 3, "signal": None}),
        (protocol.ENDED, {"exit_code": None, "signal": 9}),
        (protocol.ENDED, {"exit_code": 0, "signal": None}),
        (protocol.UNCLEAN, {"reason": "the sandbox could not be cleaned after a call"}),
    ],
)
def test_each_message_arrives_as_sent(pair, op, fields):
    protocol.send(pair[0], op, **fields)
    message, fds = protocol.receive(pair[1])
    assert message == {"op": op, **fields}
    assert fds == []


def test_descriptors_travel_with_ready(pair):
    r, w = os.pipe()
    try:
        protocol.send(pair[0], protocol.READY, fds=[r, w])
        message, fds = protocol.receive(pair[1])
        assert message == {"op": protocol.READY} and len(fds) == 2
        os.write(fds[1], b"through the passed pipe")
        assert os.read(fds[0], 100) == b"through the passed pipe"
        for fd in fds:
            os.close(fd)
    finally:
        os.close(r)
        os.close(w)


def test_a_closed_peer_reads_as_none(pair):
    pair[0].close()
    assert protocol.receive(pair[1]) == (None, [])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"X", "not a control message"),
        (b'{"op": "ready"}', "not a control message"),  # the old JSON framing
        (b"D", "0 bytes of fields, not 1"),
        (b"E\x00\x00\x00\x01", "4 bytes of fields, not 8"),
        (b"R\x00", "1 bytes of fields, not 0"),
        (b"H[1, 2]", "not an object"),
        (b"Hnot json", "Expecting value"),
    ],
)
def test_an_unreadable_message_is_a_value_error_and_its_descriptors_are_closed(pair, data, says):
    r, w = os.pipe()
    try:
        before = _open_fds()
        socket.send_fds(pair[0], [data], [r])
        with pytest.raises(ValueError, match=says):
            protocol.receive(pair[1])
        assert _open_fds() == before  # the copy of ``r`` that arrived was closed
    finally:
        os.close(r)
        os.close(w)


def _open_fds() -> set[int]:
    return set(map(int, os.listdir("/proc/self/fd")))
