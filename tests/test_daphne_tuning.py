"""The web server's tuning (core/daphne_tuning.py): autobahn's per-frame debug arguments are plain
text, made without terminal colour codes, Twisted leaves a POST's body to Django, writes go out
at once, and a plain message is one frame written in one step."""

from __future__ import annotations

import pprint

import pytest
from autobahn.twisted import websocket
from autobahn.websocket import protocol

from core.daphne_tuning import (
    direct_messages,
    no_form_parsing,
    plain_websocket_debug_arguments,
    write_through,
)


@pytest.fixture(autouse=True)
def patches_undone(monkeypatch):
    """Each test's patches are undone after it: monkeypatch keeps what they replace."""
    from daphne.http_protocol import WebRequest
    from twisted.internet import tcp

    replaced = {
        protocol: ("hltype", "hlval", "pformat"),
        websocket: ("hltype", "hlval"),
        protocol.Timings: ("__str__",),
        tcp.Connection: ("write", "_writes_through"),
        protocol.WebSocketProtocol: ("sendMessage", "layered_sendMessage", "_direct_messages"),
        WebRequest: ("__init__", "_parsing_off"),
    }
    for owner, names in replaced.items():
        for name in names:
            monkeypatch.setattr(owner, name, getattr(owner, name, False), raising=False)


def test_the_per_frame_debug_arguments_are_plain_text():
    plain_websocket_debug_arguments()
    for module in (protocol, websocket):
        assert module.hltype(protocol.WebSocketProtocol.sendData) == "<WebSocketProtocol.sendData>"
        assert module.hlval(42) == "42"


def test_each_sockets_settings_are_pretty_printed_only_for_a_debug_line_that_is_written(
    monkeypatch,
):
    """autobahn formats a new socket's settings for a debug line on every connection."""
    printed = []
    monkeypatch.setattr(pprint, "pformat", lambda value: printed.append(value) or repr(value))
    plain_websocket_debug_arguments()
    settings = [("openHandshakeTimeout", 5, "Factory")]
    line = protocol.pformat(settings)  # as autobahn's _connectionMade calls it
    assert printed == []
    assert f"\n{line}" == "\n[('openHandshakeTimeout', 5, 'Factory')]" and printed == [settings]
    timings = protocol.Timings()
    timings.track("opening")
    assert "'opening'" in str(timings)  # autobahn's other use of it: text at once


def test_twisted_leaves_a_posted_form_to_django(monkeypatch):
    """Neither the Content-Type nor the body of a POST is parsed by Twisted, and the body
    reaches daphne whole."""
    from types import SimpleNamespace

    from daphne.http_protocol import WebRequest
    from twisted.web import http
    from twisted.web.test.requesthelper import DummyChannel

    def parsed(line):
        raise AssertionError(f"Twisted parsed the Content-Type {line!r}")

    no_form_parsing()
    monkeypatch.setattr(http, "_parseContentType", parsed)
    channel = DummyChannel()
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda r: None))
    request = WebRequest(channel)
    request.process = lambda: None  # daphne's own handling is not what is tested here
    body = b"text=Hello&csrfmiddlewaretoken=x"
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.requestHeaders.setRawHeaders(b"content-length", [str(len(body)).encode()])
    request.gotLength(len(body))
    request.handleContentChunk(body)
    request.requestReceived(b"POST", b"/c/1/messages/", b"HTTP/1.1")
    assert request.args == {}
    request.content.seek(0)
    assert request.content.read() == body


class RecordingReactor:
    """Just enough of a reactor for a TCP connection: it records who asked to write."""

    def __init__(self) -> None:
        self.writers: list = []

    def addWriter(self, writer) -> None:
        if writer not in self.writers:  # as a reactor keeps them: once each
            self.writers.append(writer)

    def removeWriter(self, writer) -> None:
        if writer in self.writers:
            self.writers.remove(writer)

    def addReader(self, reader) -> None:
        pass

    def removeReader(self, reader) -> None:
        pass


def test_a_write_goes_out_at_once_and_only_what_the_socket_refuses_waits_in_order():
    import socket

    from twisted.internet import tcp
    from twisted.internet.protocol import Protocol

    write_through()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.settimeout(5)
    reactor = RecordingReactor()
    connection = tcp.Connection(ours, Protocol(), reactor=reactor)
    connection.connected = True
    try:
        connection.write(b"frame one")
        assert peer.recv(100) == b"frame one"  # sent by the write itself...
        assert reactor.writers == []  # ...with no writer registered with the reactor

        # The peer stops reading: the kernel takes what fits, the rest waits for the reactor.
        chunk = b"x" * 65536
        for _ in range(64):
            connection.write(chunk)
        connection.write(b"last")
        assert reactor.writers == [connection]
        received = bytearray()
        while len(received) < 64 * len(chunk) + 4:
            if reactor.writers:
                connection.doWrite()  # as the reactor would when the socket can take more
            received += peer.recv(1 << 20)
        assert bytes(received) == chunk * 64 + b"last"  # nothing lost, nothing reordered
    finally:
        ours.close()
        peer.close()


def _open_server_socket():
    """An autobahn server protocol past its handshake, writing to a string transport."""
    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
    from twisted.internet.testing import StringTransport

    factory = WebSocketServerFactory()
    factory.protocol = WebSocketServerProtocol
    server = factory.buildProtocol(None)
    transport = StringTransport()
    server.makeConnection(transport)
    server.state = server.STATE_OPEN
    return server, transport


def _traffic(server) -> dict:
    return {
        name: value
        for name, value in vars(server.trafficStats).items()
        if name.startswith("outgoing")
    }


def test_a_plain_message_is_the_same_frame_written_in_one_step():
    """Every length class of the header (7-bit, 16-bit, 64-bit), text and binary: the same
    bytes and the same statistics as autobahn's layered send, without its frame layer."""
    direct_messages()
    for payload in (b"", b"x", b"{" + b"a" * 123 + b"}", b"a" * 126, b"b" * 65535, b"c" * 70000):
        for binary in (False, True):
            ours, ours_out = _open_server_socket()
            theirs, theirs_out = _open_server_socket()
            writes = []
            real_write = ours_out.write
            ours_out.write = lambda data, real=real_write, writes=writes: (
                writes.append(data),
                real(data),
            )
            ours.sendFrame = None  # not through autobahn's frame layer: calling it would fail
            ours.sendMessage(payload, binary)
            protocol.WebSocketProtocol.layered_sendMessage(theirs, payload, binary)
            assert ours_out.value() == theirs_out.value(), (len(payload), binary)
            assert len(writes) == 1
            assert _traffic(ours) == _traffic(theirs)


def test_other_messages_still_go_autobahns_way():
    """Fragmented, compressed, queued behind earlier data, or on a socket that is closing:
    autobahn's own send, with its framing and its checks."""
    from autobahn.websocket.compress import PerMessageDeflate
    from autobahn.websocket.protocol import Disconnected

    direct_messages()
    fragmented, out = _open_server_socket()
    fragmented.sendMessage(b"a" * 10, fragmentSize=4)
    assert out.value() == b"\x01\x04aaaa\x00\x04aaaa\x80\x02aa"  # three frames
    compressed, out = _open_server_socket()
    compressed._perMessageCompress = PerMessageDeflate(True, False, False, 15, 15, 8)
    compressed.sendMessage(b"b" * 100)
    assert out.value()[0] == 0xC1 and len(out.value()) < 100  # RSV1: deflated
    queued, out = _open_server_socket()
    queued.send_queue.append((b"earlier", False))
    queued.triggered = True  # its writer is already scheduled
    queued.sendMessage(b"later")
    assert out.value() == b"" and queued.send_queue[-1] == (b"\x81\x05later", False)
    closing, out = _open_server_socket()
    closing.state = closing.STATE_CLOSING
    try:
        closing.sendMessage(b"late")
    except Disconnected:
        pass
    else:
        raise AssertionError("a message was sent on a closing socket")
    assert out.value() == b""
