"""The whole topology on one box, on the cluster: three web processes, two dispatchers (one
holds the lease, one stands by), four workers on two "machines" whose environment names only
Redis (no DATABASE_URL, no Django settings). A conversation moves from one web process to
another mid-answer and its reader resumes with Last-Event-ID: no event lost, none repeated."""

from __future__ import annotations

import subprocess
import sys

import httpx
from django.conf import settings

from tests.conftest import BASE_DIR, read_sse
from tests.faults.conftest import SIM_ANSWER, assert_every_request_ended

# A longer answer than the fault suite's, so the move lands mid-answer.
LONG_ANSWER = [*SIM_ANSWER, "--sim-tokens", "120"]


def start_gpu_box_worker(stack, name: str) -> None:
    """A worker as on a machine that has Redis and the model, nothing else."""
    env = {
        k: v for k, v in stack.env.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(REDIS_URL=settings.REDIS_URL, SLUICE_REDIS_PREFIX=stack.env["SLUICE_REDIS_PREFIX"])
    argv = [
        sys.executable,
        "-m",
        "worker",
        "--engine",
        "simulated",
        "--slots",
        "4",
        "--worker-id",
        name,
        "--heartbeat-interval",
        "0.5",
        *LONG_ANSWER,
    ]
    log = open(stack.logs / f"{name}.log", "ab")
    stack.processes[name] = subprocess.Popen(
        argv, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def test_a_conversation_moves_between_web_processes_mid_answer_without_a_gap(
    cluster_stack, roomy_plan, make_api
):
    stack = cluster_stack
    webs = [stack.web(f"web{i}") for i in (1, 2, 3)]
    stack.dispatcher("dispatcher-a")
    stack.dispatcher("dispatcher-b")
    workers = ["box1-w1", "box1-w2", "box2-w1", "box2-w2"]
    for name in workers:
        start_gpu_box_worker(stack, name)
    stack.wait_for_workers(*workers)
    api = make_api("alice", webs[0])
    ids = [api.submit(base_url=webs[i % 3]) for i in range(9)]  # busy, on every web process
    request_id = ids[0]
    headers = {"Authorization": f"Bearer {api.key}"}
    path = f"/api/v1/requests/{request_id}/events"

    with httpx.stream("GET", webs[0] + path, headers=headers, timeout=30) as first:
        head = read_sse(first, stop_after=6)  # web1 goes away mid-answer (a deploy, a crash)
    assert head[-1]["event"] != "final", "the answer ended before the move"
    resumed_headers = {**headers, "Last-Event-ID": head[-1]["id"]}
    with httpx.stream("GET", webs[1] + path, headers=resumed_headers, timeout=30) as second:
        tail = read_sse(second)
    with httpx.stream("GET", webs[2] + path, headers=headers, timeout=30) as whole:
        full = read_sse(whole)  # a third process reads it all, from the start

    assert tail[-1]["event"] == "final" and tail[-1]["data"]["state"] == "done"
    assert [e["id"] for e in head + tail] == [e["id"] for e in full]  # no gap, no repeat
    assert assert_every_request_ended(api, stack, ids)[request_id] == "done"
    assert all(p.poll() is None for p in stack.processes.values())
