"""Redis killed and restarted, or frozen: nothing accepted is lost or stuck, nothing hangs."""

from __future__ import annotations

import time

import httpx

from apps.chat.models import Conversation, Message
from tests.faults.conftest import assert_every_request_ended, wait_until
from worker.protocol import Keys


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
    time.sleep(1.5)
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

    # Nothing of the refused question remains, and nothing answers it later.
    time.sleep(3)
    refused_chats = Conversation.objects.filter(owner=api.user).exclude(messages__request_id=first)
    assert not Message.objects.filter(conversation__in=refused_chats).exists()
    assert httpx.get(base + "/health/", timeout=3).status_code == 200
    again = api.submit()
    assert set(assert_every_request_ended(api, stack, [again]).values()) == {"done"}
