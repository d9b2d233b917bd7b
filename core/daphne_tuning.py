"""Per-frame and per-request work daphne's libraries do that Sluice does not need: four
changes to autobahn, Twisted and daphne, made at startup by chatsite/asgi.py.

Measured on and off (`bench/ab.py 591f0ba overhead --pairs 2 -- --clients 100 --ramp 1` and
`bench/ab.py 591f0ba reconnect --pairs 2`, run from a tree with them on against the same tree
without): CPU per answer 13.4 -> 12.4 ms (-7 %), and with every page reconnecting at once the
web's CPU per socket 4.69 -> 3.50 ms (-25 %), all 600 sockets open in 3524 -> 2695 ms,
handshake p50 1927 -> 1406 ms; lower in every pair. Kept for that. They rely on the internals
of the versions pyproject.toml pins (autobahn 26.11, Twisted 26.10, daphne 4.2);
tests/test_daphne_tuning.py drives the real classes, so an upgrade that moves them fails there.

autobahn builds the arguments of a debug line for every frame it sends, whether or not debug
logging is on, and those arguments are terminal colour codes made by `click.style`: about a
twentieth of a web process's CPU under streaming load. Plain text makes the same log line
(when someone turns debug logging on) for a fraction of the cost. It also pretty-prints every
new socket's settings for another debug line: a tenth of the CPU when every page reconnects at
once; that text is now made only for a log line that is written.

Twisted's sockets buffer every write and ask the reactor to say when the socket can take it:
per websocket frame, a writer registered and removed again (two epoll changes) and one more
trip through the reactor's dispatch. A write to a socket with nothing waiting in its buffer is
now sent at once, and only what the kernel does not take is buffered, as asyncio's own
transports do.

autobahn sends a message through three layers (the message: compression, size limit,
fragmentation; the frame: header bits, masking, logging; the data: a send queue, statistics),
each with its own checks: a tenth of a web process's CPU at a hundred streams, where the frame
is always the same kind, one unmasked text frame written at once. That case is written in one
step; anything else (compression, fragments, a queued or synchronous send, logging, a message
over the size limit, a socket not open) still goes autobahn's way.
"""

from __future__ import annotations

import pprint
import struct


def _plain_type(obj) -> str:
    return f"<{getattr(obj, '__qualname__', type(obj).__name__)}>"


def _plain_value(value, color: str = "white", bold: bool = True) -> str:
    return f"{value}"


class LazyPformat:
    """`pprint.pformat(value)`, made when the log line that holds it is formatted."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value

    def __str__(self) -> str:
        return pprint.pformat(self.value)


def plain_websocket_debug_arguments() -> None:
    """Replaces autobahn's highlighting helpers in the modules that call them per frame, and
    its pretty-printing of each socket's settings."""
    from autobahn.twisted import websocket
    from autobahn.websocket import protocol

    for module in (protocol, websocket):  # frames sent, and data received
        module.hltype = _plain_type
        module.hlval = _plain_value
    protocol.pformat = LazyPformat
    # The module's one other use of it must give text at once.
    protocol.Timings.__str__ = lambda timings: pprint.pformat(timings._timings)


def write_through() -> None:
    """Plain TCP connections send a write at once when nothing waits before it (see above)."""
    from twisted.internet import tcp

    if getattr(tcp.Connection, "_writes_through", False):
        return
    buffered = tcp.Connection.write

    def write(self, data: bytes) -> None:
        if (
            type(data) is bytes
            and data
            and not self.TLS
            and self.connected
            and not self.disconnecting
            and not self._writeDisconnected
            and not self._tempDataBuffer
            and len(self.dataBuffer) == self.offset
        ):
            try:
                sent = self.socket.send(data)
            except OSError:  # full, or broken: Twisted's own write finds out and says so
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        buffered(self, data)

    tcp.Connection.write = write
    tcp.Connection._writes_through = True


def frame_header(opcode: int, length: int) -> bytes:
    """An unmasked, unfragmented frame's header (RFC 6455, section 5.2)."""
    if length <= 125:
        return bytes((0x80 | opcode, length))
    if length <= 0xFFFF:
        return struct.pack("!BBH", 0x80 | opcode, 126, length)
    return struct.pack("!BBQ", 0x80 | opcode, 127, length)


def direct_messages() -> None:
    """A server's plain messages go out as one frame in one write (see above)."""
    from autobahn.websocket.protocol import WebSocketProtocol

    if getattr(WebSocketProtocol, "_direct_messages", False):
        return
    layered = WebSocketProtocol.sendMessage
    open_state = WebSocketProtocol.STATE_OPEN

    def sendMessage(
        self, payload, isBinary=False, fragmentSize=None, sync=False, doNotCompress=False
    ):
        length = len(payload)
        if (
            type(payload) is not bytes
            or fragmentSize is not None
            or sync
            or self.state != open_state
            or self._perMessageCompress is not None
            or not self.factory.isServer
            or self.maskServerFrames
            or self.send_queue
            or self.trackedTimings
            or self.logFrames
            or self.logOctets
            or 0 < self.maxMessagePayloadSize < length
            or 0 < self.autoFragmentSize < length
        ):
            return layered(self, payload, isBinary, fragmentSize, sync, doNotCompress)
        data = frame_header(2 if isBinary else 1, length) + payload
        stats = self.trafficStats  # as autobahn keeps them, for its own reports
        stats.outgoingWebSocketMessages += 1
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsAppLevel += length
        stats.outgoingOctetsWebSocketLevel += length
        stats.outgoingOctetsWireLevel += len(data)
        self.transport.write(data)

    WebSocketProtocol.sendMessage = sendMessage
    WebSocketProtocol.layered_sendMessage = layered  # autobahn's own, kept callable
    WebSocketProtocol._direct_messages = True


def no_form_parsing() -> None:
    """Twisted parses the Content-Type of every POST (with the `email` package) and a form's
    whole body (multipart uploads included) into `request.args`, which daphne never reads:
    Django parses the body itself. About a thirtieth of a web process's CPU on the API path;
    off."""
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest, "_parsing_off", False):
        return
    init = WebRequest.__init__

    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False  # read in Request.requestReceived

    WebRequest.__init__ = __init__
    WebRequest._parsing_off = True
