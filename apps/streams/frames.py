"""Output-stream events as the browser and API clients see them: the one translation that the
websocket and Server-Sent Events both use."""

from __future__ import annotations

import json
import re

from contract.protocol import EventType
from core.markdown import render_markdown

# notice: what the person is told beside the answer (retrieval unavailable: the first status).
STATUS_FIELDS = ("position", "eta_seconds", "reason", "retry_after", "notice")
# An output-stream entry id, as a reader that resumes names the last one it saw.
EVENT_ID = re.compile(r"\d{1,20}(-\d{1,20})?")


def frame_for_event(request_id: str, entry_id: str, fields: dict[str, str]) -> dict | None:
    """One output-stream entry as a frame; None for an entry readers do not show."""
    kind = fields.get("type")
    base = {"request_id": request_id, "event_id": entry_id}
    if kind == EventType.DELTA:
        return {**base, "type": "delta", "text": fields.get("text", "")}
    if kind == EventType.START:
        return {
            **base,
            "type": "start",
            "attempt": int(fields.get("attempt", 1)),
            "worker": fields.get("worker", ""),
            "prompt_tokens": int(fields.get("prompt_tokens") or 0),
        }
    if kind == EventType.STATUS:
        frame = {**base, "type": "status", "state": fields.get("state", "")}
        for name in STATUS_FIELDS:
            if name in fields:
                frame[name] = fields[name]
        if fields.get("citations"):
            frame["citations"] = json.loads(fields["citations"])
        return frame
    if kind == EventType.FINAL:
        text = fields.get("text", "")
        frame = {
            **base,
            "type": "final",
            "state": fields.get("state", ""),
            "text": text,
            "html": render_markdown(text),
            "error": fields.get("error", ""),
            "finish_reason": fields.get("finish_reason", ""),
            "usage": json.loads(fields.get("usage") or "{}"),
        }
        if fields.get("retry_after"):
            frame["retry_after"] = fields["retry_after"]
        return frame
    return None


def frames_for_batch(request_id: str, entries: list[tuple[str, dict[str, str]]]) -> list[dict]:
    """Frames for entries read together, consecutive deltas merged into one frame (carrying
    the last one's id, so a resume continues after all of them): a page that fell behind, or
    a busy web process, sends one frame where the worker wrote several. A status that only
    names a state ("dispatched") is dropped when a later status or the attempt's start comes
    in the same batch: the page would replace it at once."""
    frames: list[dict] = []
    for entry_id, fields in entries:
        frame = frame_for_event(request_id, entry_id, fields)
        if frame is None:
            continue
        last = frames[-1] if frames else None
        if last is not None and frame["type"] == "delta" and last["type"] == "delta":
            last["text"] += frame["text"]
            last["event_id"] = entry_id
            continue
        if last is not None and frame["type"] in ("status", "start") and _superseded(last):
            frames.pop()
        frames.append(frame)
    return frames


def _superseded(frame: dict) -> bool:
    """A status frame whose whole news is its state: no position, reason or citations."""
    return frame["type"] == "status" and frame.keys() <= {"type", "state", "request_id", "event_id"}
