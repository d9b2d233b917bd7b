"""`make run`'s supervisor: embedded PostgreSQL and Redis come up, and Ctrl-C leaves no
postgres or redis-server process behind; a second start reuses the data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import BASE_DIR


def project_servers(var_dir) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(var_dir) in cmdline and process.info["name"] in ("postgres", "redis-server"):
            found.append(process)
    return found


def start_services(var_dir) -> tuple[subprocess.Popen, dict[str, str]]:
    env = dict(os.environ, SLUICE_VAR_DIR=str(var_dir))
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "devstack.stack", "services"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    urls = {}
    deadline = time.monotonic() + 60
    while len(urls) < 2 and time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("export "):
            name, _, value = line[7:].strip().partition("=")
            urls[name] = value.strip("'")
    return process, urls


@pytest.mark.slow
def test_ctrl_c_stops_embedded_postgres_and_redis_and_data_survives(tmp_path):
    import psycopg
    import redis

    process, urls = start_services(tmp_path)
    try:
        assert set(urls) == {"DATABASE_URL", "REDIS_URL"}
        assert project_servers(tmp_path), "servers should be running"
        redis.Redis.from_url(urls["REDIS_URL"]).set("kept", "yes")
        db_url = urls["DATABASE_URL"]
        socket_dir = db_url.split("@/")[1].split("/sluice")[0].replace("%2F", "/")
        with psycopg.connect(host=socket_dir, dbname="sluice", user="postgres") as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    assert process.returncode == 0
    # The supervisor returns only once its servers have exited: nothing is left at that point.
    assert project_servers(tmp_path) == []

    process, urls = start_services(tmp_path)
    try:
        assert redis.Redis.from_url(urls["REDIS_URL"]).get("kept") == b"yes"
        socket_dir = urls["DATABASE_URL"].split("@/")[1].split("/sluice")[0].replace("%2F", "/")
        with psycopg.connect(host=socket_dir, dbname="sluice", user="postgres") as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    assert project_servers(tmp_path) == []


TWO_STARTS = """
import sys
from pathlib import Path

import psycopg

from devstack.stack import embedded_postgres


def connect(url):
    socket_dir = url.split("@/")[1].split("/sluice")[0].replace("%2F", "/")
    return psycopg.connect(host=socket_dir, dbname="sluice", user="postgres")


datadir = Path(sys.argv[1])
with embedded_postgres(datadir) as url, connect(url) as conn:
    conn.execute("CREATE TABLE kept (x int)")
with embedded_postgres(datadir) as url, connect(url) as conn:
    print("rows", conn.execute("SELECT count(*) FROM kept").fetchone()[0])
"""


@pytest.mark.slow
def test_one_process_can_start_the_same_data_directory_twice(tmp_path):
    """A benchmark creates its cluster, stops it to change its configuration and starts it
    again, all in one process: the second start must start a server, not hand back the first,
    stopped one. (In a process of its own: pgserver's exit hooks log as the process ends.)"""
    done = subprocess.run(
        [sys.executable, "-c", TWO_STARTS, str(tmp_path / "postgres")],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "rows 0" in done.stdout
    assert project_servers(tmp_path) == []
