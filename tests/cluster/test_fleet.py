"""`make run-fleet` (devstack/fleet.py): its proxy passes streams unbuffered and skips a web
process that is gone; the whole fleet starts (with an embedding worker on each machine when
retrieval is on the fleet), answers through the proxy, keeps the workers' "machines" free of the
database, and stops every process on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from apps.chat.models import Message
from apps.rag import fleet as embedding_fleet
from devstack.fleet import serve_proxy
from devstack.stack import free_port
from tests.conftest import BASE_DIR, process_env, read_sse, wait_until
from tests.faults.conftest import pid_alive

pytestmark = pytest.mark.slow


async def _backend(name: bytes) -> tuple[asyncio.Server, int]:
    """Says its name, then waits for "go" before it says the rest: a proxy that buffered either
    way would leave the client waiting for the first line forever."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(name + b" first\n")
        await writer.drain()
        assert await reader.readline() == b"go\n"
        writer.write(name + b" second\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_proxy_takes_turns_skips_a_gone_backend_and_buffers_nothing():
    (one, one_port), (two, two_port) = await _backend(b"one"), await _backend(b"two")
    gone_port = free_port()  # nothing listens there: a web process that died
    port = free_port()
    proxy = asyncio.ensure_future(
        serve_proxy("127.0.0.1", port, [("127.0.0.1", p) for p in (one_port, gone_port, two_port)])
    )
    try:
        await asyncio.sleep(0.2)
        names = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            first = await asyncio.wait_for(reader.readline(), 5)
            writer.write(b"go\n")
            await writer.drain()
            second = await asyncio.wait_for(reader.readline(), 5)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the backend's close passes
            writer.close()
            name = first.split()[0]
            assert (first, second) == (name + b" first\n", name + b" second\n")
            names.append(name)
        assert names == [b"one", b"two", b"one", b"two"]
    finally:
        proxy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await proxy
        one.close()
        two.close()


def _environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_the_fleet_starts_answers_through_its_proxy_and_stops_on_ctrl_c(
    transactional_db, redis_prefix, tmp_path
):
    # The session's cluster and test database, a var/ of its own; the simulated engine and no
    # demo corpus keep it quick (make run-fleet itself runs llama.cpp and ingests the docs).
    # Retrieval on the fleet: each machine runs an embedding worker too.
    env = dict(
        process_env(redis_prefix), SLUICE_VAR_DIR=str(tmp_path), RAG_EMBEDDING_SERVING="fleet"
    )
    port = free_port()
    output = tmp_path / "fleet.out"
    with open(output, "wb") as out:
        fleet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devstack.fleet",
                "--port",
                str(port),
                "--engine",
                "simulated",
                "--no-corpus",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    text = lambda: output.read_text(errors="replace")  # noqa: E731
    pids: dict[str, int] = {}
    try:
        wait_until(
            lambda: "the fleet is up" in text() or fleet.poll() is not None,
            timeout=150,
            what="the fleet to start",
            every=0.5,
        )
        assert fleet.poll() is None, text()[-3000:]
        pids = {n: int(p) for n, p in re.findall(r"\]\s+(\S+)\s+pid (\d+)", text())}
        machines = ["box1-w1", "box2-w1", "box1-embed", "box2-embed"]
        assert sorted(pids) == sorted(
            ["web1", "web2", "web3", "dispatcher-a", "dispatcher-b", "proxy", *machines]
        )
        assert "retrieval on the fleet" in text()
        for worker in machines:  # a GPU machine knows Redis, not the database
            assert "DATABASE_URL" not in _environ(pids[worker])
            assert _environ(pids[worker])["REDIS_URL"] == env["REDIS_URL"]
        # The embedding workers serve the web's model over the cluster.
        embedded = embedding_fleet.request(model="all-MiniLM-L6-v2", texts=["a gate"], timeout=60)
        assert embedded.vectors.shape == (1, 384)

        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as demo:  # the demo login it seeded
            page = demo.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
            signed_in = demo.post(
                "/accounts/login/",
                data={
                    "username": "demo",
                    "password": "sluice-demo",
                    "csrfmiddlewaretoken": token,
                },
                headers={"Referer": base + "/accounts/login/"},
            )
            assert signed_in.status_code == 302, signed_in.text[:500]
            made = demo.post(
                "/accounts/profile/api-keys/new/",
                follow_redirects=True,
                data={"csrfmiddlewaretoken": demo.cookies["csrftoken"]},
                headers={"Referer": base + "/accounts/profile/"},
            )
            key = re.search(r"sk-sluice-[\w-]+", made.text)[0]
        headers = {"Authorization": f"Bearer {key}"}
        submitted = httpx.post(
            base + "/api/v1/requests", json={"text": "Hello, fleet."}, headers=headers, timeout=30
        )
        assert submitted.status_code == 202, submitted.text
        request_id = submitted.json()["request_id"]
        with httpx.stream(
            "GET", f"{base}/api/v1/requests/{request_id}/events", headers=headers, timeout=60
        ) as events:
            final = read_sse(events)[-1]
        assert final["event"] == "final" and final["data"]["state"] == "done"
        assert final["data"]["text"]
        wait_until(
            lambda: Message.objects.filter(request_id=request_id).exists(),
            what="a dispatcher to store the answer",
        )
    finally:
        if fleet.poll() is None:
            os.killpg(fleet.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        try:
            code = fleet.wait(timeout=60)
        finally:
            if fleet.poll() is None:
                fleet.kill()
            left = [name for name, pid in pids.items() if pid_alive(pid)]
            for name in left:  # whatever happened, nothing stays running after the test
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[name], signal.SIGKILL)
    assert code == 0, text()[-3000:]
    assert "stopping" in text()
    assert not left, f"still running after Ctrl-C: {left}"
