"""The web server's tuning: autobahn's per-frame debug arguments are plain text, made without
terminal colour codes, and daphne runs on uvloop."""

from __future__ import annotations

import subprocess
import sys

from autobahn.twisted import websocket
from autobahn.websocket import protocol

from chatsite.daphne_tuning import plain_websocket_debug_arguments
from chatsite.stack import web_command
from tests.conftest import BASE_DIR


def test_the_per_frame_debug_arguments_are_plain_text():
    plain_websocket_debug_arguments()
    for module in (protocol, websocket):
        assert module.hltype(protocol.WebSocketProtocol.sendData) == "<WebSocketProtocol.sendData>"
        assert module.hlval(42) == "42"


def test_the_web_command_runs_daphne_on_uvloop():
    assert web_command("127.0.0.1", 8000)[1:3] == ["-m", "chatsite.serve"]
    probe = ("import chatsite.serve, daphne.server, uvloop; "
             "print(isinstance(daphne.server.twisted_loop, uvloop.Loop))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=BASE_DIR, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "True", done.stderr
