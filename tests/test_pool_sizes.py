"""Each process's connection pools, as its settings size them: a web process takes a Redis
connection for each websocket database thread and a few more, so its threads never queue for
one; the other processes keep a small pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BASE_DIR

READ = """
import json, sys
from chatsite.settings import process
if sys.argv[1] == "web":
    process.mark_web()
from django.conf import settings
print(json.dumps([settings.REDIS_POOL_SIZE, settings.WEB_DB_THREADS]))
"""


def sizes(kind: str, **env: str) -> list[int]:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_POOL_SIZE", "WEB_DB_THREADS")
    }
    environ.update(env, DJANGO_SETTINGS_MODULE="chatsite.settings.test")
    out = subprocess.run(
        [sys.executable, "-c", READ, kind],
        env=environ,
        cwd=BASE_DIR,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("kind", "env", "expected"),
    [
        ("web", {}, [12, 8]),
        ("web", {"WEB_DB_THREADS": "3"}, [7, 3]),
        ("web", {"REDIS_POOL_SIZE": "5"}, [5, 8]),
        ("other", {}, [4, 8]),
    ],
)
def test_redis_pool_size_follows_the_web_processs_database_threads(kind, env, expected):
    assert sizes(kind, **env) == expected
