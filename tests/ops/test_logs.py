"""Structured logs: one JSON object per line with LOG_FORMAT=json, each line about a request
with its id; plain text stays the default."""

from __future__ import annotations

import json
import logging
import sys

import httpx
import pytest
from django.conf import settings

from contract import logs
from contract.protocol import new_request_id


def record(msg, *args, **extra) -> logging.LogRecord:
    made = logging.LogRecord("sluice.test", logging.INFO, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


def test_a_line_about_a_request_carries_its_id_however_it_was_logged():
    formatter = logs.JsonFormatter(process="web")
    request_id = new_request_id()
    by_argument = json.loads(formatter.format(record("request %s settled", request_id)))
    assert by_argument["request_id"] == request_id and by_argument["process"] == "web"
    assert by_argument["msg"] == f"request {request_id} settled"
    assert json.loads(formatter.format(record("x", request_id="abc")))["request_id"] == "abc"
    token = logs.request_id_var.set(request_id)
    try:
        assert json.loads(formatter.format(record("engine failed")))["request_id"] == request_id
    finally:
        logs.request_id_var.reset(token)
    assert "request_id" not in json.loads(formatter.format(record("worker %s ready", "w1")))
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("failed")
        failed.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(formatter.format(failed))["exc"]


def test_plain_text_is_the_default():
    handler = settings.LOGGING["handlers"]["console"]
    assert settings.LOG_FORMAT == "plain" and handler["formatter"] == "plain"


@pytest.mark.django_db(transaction=True)
def test_the_web_logs_json_with_the_request_id(start_web, capfd):
    base = start_web(LOG_FORMAT="json", LOG_LEVEL="INFO")
    request_id = new_request_id()
    httpx.get(f"{base}/api/v1/requests/{request_id}", timeout=5)
    httpx.get(f"{base}/this-page-does-not-exist", timeout=5)
    err = capfd.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines and all(line["process"] == "web" for line in lines)
    about = [line for line in lines if request_id in line["msg"]]
    assert about and all(line["request_id"] == request_id for line in about)
