"""The web process: daphne on uvloop, as `make run` and the Procfile start it."""

from __future__ import annotations

import subprocess
import sys

from devstack.stack import web_command
from tests.conftest import BASE_DIR


def test_the_web_command_runs_daphne_on_uvloop():
    assert web_command("127.0.0.1", 8000)[1:3] == ["-m", "core.serve"]
    probe = (
        "import core.serve, daphne.server, uvloop; "
        "print(isinstance(daphne.server.twisted_loop, uvloop.Loop))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=BASE_DIR, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True", done.stderr
