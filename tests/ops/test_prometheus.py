"""Metrics from every process, parsed as Prometheus parses them; the Grafana dashboard uses only
names they export; and the JSON logs of one request, grepped by its id across the processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.accounts.services import user_create
from devstack.stack import free_port
from tests.conftest import BASE_DIR, process_env, stop_process
from tests.ops.helpers import final_event, submit, until

GRAFANA = BASE_DIR / "docs" / "grafana-dashboard.json"


def sample_names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def grafana_names() -> set[str]:
    board = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert exprs
    return {name for expr in exprs for name in re.findall(r"\bsluice_[a-z_]+", expr)}


@pytest.mark.django_db
def test_the_web_metrics_parse(client_for, user):
    user.is_staff = True
    user.save()
    client = client_for(user)
    client.get("/health/")
    names = sample_names(client.get("/metrics").content.decode())
    assert {
        "sluice_web_http_requests_total",
        "sluice_web_http_request_seconds_bucket",
        "sluice_web_streams_open",
        "sluice_requests_total",
        "sluice_queue_depth",
        "sluice_requests_by_reason_total",
        "sluice_redis_up",
        "process_cpu_seconds_total",
    } <= names


@pytest.mark.django_db(transaction=True)
def test_every_process_exports_what_the_dashboard_reads_and_logs_each_request(
    redis_prefix, client_for, tmp_path
):
    env = process_env(redis_prefix) | {"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"}
    dispatcher_port, worker_port = free_port(), free_port()
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("dispatcher", "worker")}
    processes = [
        subprocess.Popen(
            [sys.executable, "manage.py", "run_dispatcher"],
            cwd=BASE_DIR,
            env=env | {"DISPATCHER_METRICS_PORT": str(dispatcher_port)},
            stdout=logs["dispatcher"],
            stderr=logs["dispatcher"],
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker",
                "--engine",
                "simulated",
                "--slots",
                "2",
                "--worker-id",
                "w-metrics",
                "--prefix",
                redis_prefix,
                "--metrics-port",
                str(worker_port),
                "--heartbeat-interval",
                "0.5",
                "--sim-first-token-ms",
                "5",
                "--sim-decode-ms",
                "1",
                "--sim-tokens",
                "6",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=logs["worker"],
            stderr=logs["worker"],
        ),
    ]
    try:
        asker = user_create(username="metered", password="correct-horse-battery")
        request_id = submit(asker)
        until(lambda: final_event(request_id))
        until(lambda: "sluice_worker_answers_total" in scrape(worker_port))
        until(lambda: "sluice_dispatcher_ttft_seconds_count 1.0" in scrape(dispatcher_port))
        asker.is_staff = True
        asker.save()
        found = {
            "web": sample_names(client_for(asker).get("/metrics").content.decode()),
            "dispatcher": sample_names(scrape(dispatcher_port)),
            "worker": sample_names(scrape(worker_port)),
        }
    finally:
        for process in processes:
            stop_process(process)
        for log in logs.values():
            log.close()
    assert "sluice_dispatcher_decisions_total" in found["dispatcher"]
    assert {
        "sluice_worker_ttft_seconds_bucket",
        "sluice_worker_engine_kv_cache_usage",
        "sluice_worker_capacity_slots",
    } <= found["worker"]
    exported = set().union(*found.values())
    assert grafana_names() - exported == set()

    # grep <request id> over the logs: JSON lines, each with the id, telling the story.
    story = {}
    for name in logs:
        lines = [
            line
            for line in (tmp_path / f"{name}.log").read_text().splitlines()
            if request_id in line
        ]
        parsed = [json.loads(line) for line in lines]
        assert parsed and all(p["request_id"] == request_id for p in parsed), name
        assert {p["process"] for p in parsed} == {name}
        story[name] = " ".join(p["msg"] for p in parsed)
    assert "started: attempt 1" in story["worker"] and "finished: done" in story["worker"]
    assert "settled: done" in story["dispatcher"]
