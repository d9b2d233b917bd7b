"""Log lines as plain text (the default) or one JSON object per line (`LOG_FORMAT=json`), the
same in the web, the dispatcher and the workers.

A line about a request carries its id in a `request_id` field, so `grep <id>` over every
process's logs tells the request's story. The id comes from, in order: the record's own
`request_id` (`log.info(..., extra={"request_id": ...})`), the request the current task is
running (`request_id_var`, set by a worker's attempt), or a request id among the message's
arguments (`log.info("request %s ...", request_id)`, the way Sluice logs them).

No Django here: the worker uses it as it is, and the web's LOGGING setting names the classes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("request_id", default="")

REQUEST_ID = re.compile(r"[0-9a-f]{32}")  # protocol.new_request_id(): uuid4().hex
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def request_id_of(record: logging.LogRecord) -> str:
    found = getattr(record, "request_id", "") or request_id_var.get()
    if found:
        return str(found)
    args = record.args
    values = args.values() if isinstance(args, dict) else args or ()
    for value in values:
        if isinstance(value, str) and len(value) == 32 and REQUEST_ID.fullmatch(value):
            return value
    return ""


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "process", "pid", "msg", "request_id"?, "exc"?} per line."""

    def __init__(self, *args, process: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.process = process or process_role()

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "process": self.process,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        request_id = request_id_of(record)
        if request_id:
            line["request_id"] = request_id
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def process_role() -> str:
    """web, dispatcher or the management command's name, for the `process` field (a worker
    names itself)."""
    role = os.environ.get("SLUICE_PROCESS", "")
    if role:
        return role
    if sys.argv and "daphne" in sys.argv[0]:
        return "web"
    argv = [os.path.basename(a) for a in sys.argv[:2]]
    if argv[:1] == ["manage.py"] and len(argv) > 1:
        return "dispatcher" if argv[1] == "run_dispatcher" else argv[1]
    return argv[0] if argv else ""


def json_wanted(value: str | None = None) -> bool:
    return (value if value is not None else os.environ.get("LOG_FORMAT", "")).lower() == "json"


def configure(*, level: str = "INFO", fmt: str | None = None, process: str = "") -> None:
    """Root logging for a process without Django (the worker)."""
    handler = logging.StreamHandler()
    if json_wanted(fmt):
        handler.setFormatter(JsonFormatter(process=process))
    else:
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
