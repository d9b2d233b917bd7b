"""Redis killed and restarted, or frozen: nothing accepted is lost or stuck, nothing hangs."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import websockets
from django.test import Client

from apps.accounts.services import user_create
from apps.chat.models import Conversation, Message
from apps.chat.services import conversation_create
from contract.protocol import Keys
from tests.faults.conftest import assert_every_request_ended, wait_until

# The websocket's close code for "try again later" (1013's meaning; apps/streams/handshake.py).
TRY_AGAIN_LATER = 4503


def _streaming(stack, request_ids: list[str]) -> int:
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    return sum(client.hget(keys.request(i), "state") == "streaming" for i in request_ids)


def test_redis_killed_and_restarted_mid_answers_strands_nothing(stack, roomy_plan, make_api):
    base = stack.up({"w1": 6, "w2": 6})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(10)]
    wait_until(lambda: _streaming(stack, ids) >= 5, what="answers streaming")
    stack.redis_server.kill()
    time.sleep(1.5)  # an outage, not a blip: every process meets Redis gone before it returns
    stack.redis_server.start()  # the same port and append-only file
    ended = assert_every_request_ended(api, stack, ids, timeout=120)
    assert set(ended.values()) <= {"done", "failed"}
    # Every process came through it, and the service takes new work at once.
    for name in ("web", "dispatcher", "w1", "w2"):
        assert stack.processes[name].poll() is None, stack.log(name)
    more = [api.submit() for _ in range(4)]
    assert set(assert_every_request_ended(api, stack, more).values()) == {"done"}


def test_a_frozen_redis_fails_requests_fast_and_an_abandoned_one_never_runs(
    stack, roomy_plan, make_api
):
    stack.env["REDIS_SOCKET_TIMEOUT"] = "2"
    base = stack.up({"w1": 2})
    api = make_api("alice", base)
    first = api.submit()
    assert set(assert_every_request_ended(api, stack, [first]).values()) == {"done"}

    stack.redis_server.freeze()
    try:
        # The client gives up long before anything would hang for good: a hang fails here.
        health = httpx.get(base + "/health/", timeout=3)
        assert health.status_code == 503 and health.json()["redis"] != "ok"
        refused = api.http.post(base + "/api/v1/requests", json={"text": "Still there?"})
        assert refused.status_code == 503 and refused.json()["error"]
        status = api.http.get(f"{base}/api/v1/requests/{first}")
        assert status.status_code == 503 and status.json()["error"]
    finally:
        stack.redis_server.thaw()

    # Redis answers again, and a question sent now is answered and stored: it went through
    # the admission stream, a worker and the recorder after the refused one's entry (which
    # Redis may have run late, once thawed), so that one would have been answered by now.
    wait_until(
        lambda: httpx.get(base + "/health/", timeout=3).status_code == 200,
        timeout=30,
        what="the web process to find Redis back",
    )
    again = api.submit()
    assert set(assert_every_request_ended(api, stack, [again]).values()) == {"done"}
    # Nothing of the refused question remains, and nothing answered it.
    answered = Conversation.objects.filter(owner=api.user, messages__request_id__in=[first, again])
    refused_chats = Conversation.objects.filter(owner=api.user).exclude(pk__in=answered)
    assert not Message.objects.filter(conversation__in=refused_chats).exists()


def _page_sockets(base: str, paths: list[str], cookie: str, *, listen: float = 15) -> list:
    """Opens a page's websockets at once, as the page does, and reads each for `listen` seconds
    or until it closes: what the page would see of each, (its frames, its close code or None
    while it is still open). A handshake with no HTTP response fails here."""

    async def one(path: str) -> tuple[list[dict], int | None]:
        url = base.replace("http://", "ws://") + path
        headers = {"Origin": base, "Cookie": cookie}
        async with websockets.connect(url, additional_headers=headers, open_timeout=15) as ws:
            frames = []
            try:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=listen)))
            except websockets.ConnectionClosed as closed:
                return frames, closed.rcvd.code if closed.rcvd else None
            except TimeoutError:
                return frames, None

    async def run() -> list:
        return await asyncio.gather(*(one(path) for path in paths))

    return asyncio.run(run())


def test_sockets_opened_while_redis_is_frozen_are_told_to_try_again_later(stack, roomy_plan):
    """A page's websockets get an answer the page can show, as its HTTP requests get a 503,
    rather than a handshake dropped with no response (which a page cannot tell from a crashed
    server); once Redis answers again, the page's next try opens them."""
    base = stack.web()
    user = user_create(username="alice", password="correct-horse-battery")
    conversation = conversation_create(owner=user)
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    paths = [f"/ws/chat/{conversation.id}/", "/ws/inbox/"]

    stack.redis_server.freeze()
    try:
        seen = _page_sockets(base, paths, cookie)
    finally:
        stack.redis_server.thaw()
    for frames, code in seen:
        assert code == TRY_AGAIN_LATER, seen
        assert [f["type"] for f in frames] == ["unavailable"] and frames[0]["message"], seen

    # Redis answers again: both open and stay open.
    reopened = _page_sockets(base, paths, cookie, listen=2)
    assert [code for _, code in reopened] == [None, None], reopened
