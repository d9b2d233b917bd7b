"""Sluice's processes keep what their startup made out of the garbage collector's passes."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import BASE_DIR

PROBE = """
import gc, weakref
from contract.gc_tuning import YOUNG_THRESHOLD, freeze_startup_objects

class Cycle:
    pass

def garbage():
    cycle = Cycle()
    cycle.me = cycle
    return weakref.ref(cycle)

kept = Cycle()
startup_garbage = garbage()
freeze_startup_objects()
assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == YOUNG_THRESHOLD
assert startup_garbage() is None  # freed, not frozen
assert not any(o is kept for o in gc.get_objects())  # frozen: in no collection's walk
later_garbage = garbage()
gc.collect()
assert later_garbage() is None  # garbage made after startup is still collected
print("ok")
"""


def test_startup_objects_are_frozen_and_later_garbage_is_still_collected():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=BASE_DIR, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_web_server_freezes_its_startup_objects_and_a_test_run_does_not():
    probe = "import gc, chatsite.asgi; print(gc.get_freeze_count() > 0)"
    for process, frozen in (("web", "True"), ("", "False")):
        env = {"SLUICE_PROCESS": process, "RAG_WARM_UP": "false"}
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        assert done.stdout.strip().splitlines()[-1:] == [frozen], done.stderr[-2000:]
