"""autobahn's per-frame debug arguments are plain text, made without terminal colour codes."""

from __future__ import annotations

from autobahn.twisted import websocket
from autobahn.websocket import protocol

from chatsite.daphne_tuning import plain_websocket_debug_arguments


def test_the_per_frame_debug_arguments_are_plain_text():
    plain_websocket_debug_arguments()
    for module in (protocol, websocket):
        assert module.hltype(protocol.WebSocketProtocol.sendData) == "<WebSocketProtocol.sendData>"
        assert module.hlval(42) == "42"
