"""The embedding worker stopped, frozen and back, with questions asked through the API of a web
process that embeds on the fleet (RAG_EMBEDDING_SERVING=fleet): every accepted request still
ends once; while no worker embeds, a question is answered without passages (the web says so in
its log and metrics) or, on a web set to refuse, turned away with a reason; passages return
with the worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from apps.rag.models import Corpus
from apps.rag.services import corpus_ingest_paths
from contract.protocol import Keys
from tests.faults.conftest import assert_every_request_ended, wait_until
from tests.rag.conftest import FIXTURES

FLEET = {
    "RAG_EMBEDDING_SERVING": "fleet",
    "RAG_EMBED_TIMEOUT_SECONDS": "5",  # two shared cores under the whole stack: room to spare
    "RAG_FLEET_STALE_SECONDS": "3",
}


def _citations(stack, request_id: str) -> list:
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    raw = stack.redis_server.client().hget(keys.request(request_id), "citations")
    return json.loads(raw or "[]")


def _embedder(stack) -> None:
    stack._start(
        "embedder",
        [
            sys.executable,
            "-m",
            "worker",
            "embed",
            "--worker-id",
            "e1",
            "--heartbeat-interval",
            "0.5",
        ],
    )
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    wait_until(lambda: client.exists(keys.embedder("e1")), timeout=120, what="the embedder")


def test_a_stopped_embedding_worker_leaves_answers_without_passages_or_refused(
    stack, roomy_plan, make_api
):
    corpus = Corpus.objects.create(name="handbook", access=Corpus.Access.EVERYONE)
    corpus_ingest_paths(corpus=corpus, paths=[str(FIXTURES / "handbook")])
    stack.env.update(FLEET)
    base = stack.up({"w1": 4})
    _embedder(stack)
    api = make_api("alice", base)
    asked = []

    first = api.submit("How many days of paid vacation do I get?")
    asked.append(first)
    assert_every_request_ended(api, stack, [first])
    # The worker embedded the question: passages given.
    assert _citations(stack, first), stack.log("web")[-3000:]

    stack.signal("embedder", signal.SIGSTOP)  # frozen: the question waits out its deadline
    frozen = api.submit("Can I carry unused vacation days into next year?")
    assert frozen is not None
    asked.append(frozen)
    stack.signal("embedder", signal.SIGCONT)
    stack.signal("embedder", signal.SIGTERM)  # then stopped
    # A stop is noticed within a read (1 s), and whatever hangs is cancelled 10 s after the
    # signal (embed_main.STOP_GRACE_SECONDS); the margin is for a loaded machine. If it still
    # does not end, SIGUSR1 puts its threads' stacks in the log the failure shows.
    try:
        stack.processes["embedder"].wait(timeout=90)
    except subprocess.TimeoutExpired:
        stack.signal("embedder", signal.SIGUSR1)  # its threads' stacks, into its log
        time.sleep(2)
        pytest.fail("the embedder did not stop:\n" + stack.log("embedder")[-6000:])
    stopped = api.submit("What does the coffee machine's E42 mean?")
    assert stopped is not None
    asked.append(stopped)
    ended = assert_every_request_ended(api, stack, asked)
    assert ended[frozen] == ended[stopped] == "done"
    assert _citations(stack, frozen) == _citations(stack, stopped) == []
    assert stack.log("web").count("retrieval unavailable, answering without passages") >= 2

    stack.env["RAG_EMBEDDING_UNAVAILABLE"] = "refuse"
    refusing = stack.web("web-refuse")
    response = api.http.post(refusing + "/api/v1/requests", json={"text": "Who runs bird club?"})
    assert response.status_code == 503, response.text
    assert "cannot search its documents" in response.json()["error"]
    assert response.headers["Retry-After"]

    _embedder(stack)  # back: passages again, on both webs
    again = api.submit("How do I roll back the billing service?")
    also = api.submit("Which flag enables billing v2?", base_url=refusing)
    assert again and also
    assert_every_request_ended(api, stack, [again, also])
    assert _citations(stack, again) and _citations(stack, also)
    assert httpx.get(base + "/health/").status_code == 200
