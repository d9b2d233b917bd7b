"""Output-stream entries read together become as few websocket frames as the page needs."""

from __future__ import annotations

from apps.streams.frames import frames_for_batch


def entry(n: int, **fields) -> tuple[str, dict[str, str]]:
    return f"{n}-0", fields


def test_deltas_read_together_are_one_frame_that_resumes_after_the_last():
    frames = frames_for_batch(
        "r", [entry(1, type="delta", text="Hel"), entry(2, type="delta", text="lo")]
    )
    assert [(f["type"], f["text"], f["event_id"]) for f in frames] == [("delta", "Hello", "2-0")]


def test_a_bare_status_followed_in_the_batch_by_a_start_is_not_sent():
    frames = frames_for_batch(
        "r",
        [
            entry(1, type="status", state="queued", citations='[{"number": 1}]'),
            entry(2, type="status", state="dispatched"),
            entry(3, type="start", attempt="1", worker="w1", prompt_tokens="9"),
            entry(4, type="delta", text="Hi"),
        ],
    )
    # The queued status carries the sources, so it stays; "dispatched" is replaced at once.
    assert [(f["type"], f.get("state")) for f in frames] == [
        ("status", "queued"),
        ("start", None),
        ("delta", None),
    ]
    assert frames[0]["citations"] == [{"number": 1}]


def test_a_status_that_says_more_than_its_state_is_kept():
    frames = frames_for_batch(
        "r",
        [
            entry(1, type="status", state="queued", position="3"),
            entry(2, type="status", state="queued", position="2"),
        ],
    )
    assert [f["position"] for f in frames] == ["3", "2"]


def test_a_bare_status_last_in_its_batch_is_sent():
    frames = frames_for_batch("r", [entry(1, type="status", state="dispatched")])
    assert [(f["type"], f["state"], f["event_id"]) for f in frames] == [
        ("status", "dispatched", "1-0")
    ]
