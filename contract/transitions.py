"""The only code that writes a request's state and events, and moves its work item.

Every process calls these: the web (submitted, stopped), the dispatcher (dispatched, position,
ended in line, lost), the worker (started, delta, finished) and the recorder (dead letters).
Each function queues commands on a redis-py pipeline, sync or asyncio alike, so callers batch
them with their own work; the caller executes and reads the replies with the `*_result`
helpers where a reply means something.

Attempts are fenced. `start` makes the caller the request's *owner* with a token of its own and
counts the attempt; a delta or a final event is written only while the writer is still the
owner, so a worker that was paused, taken for dead and replaced learns it lost its claim (the
write answers `LOST`) and stops, and readers never see two attempts interleaved. A request ends
once: a final event is written only while the request has not ended, by its owner or (token
`""`) by the dispatcher for a request no attempt owns any more. Ending clears the owner, so a
late attempt stops too.

The scripts (contract/transition_scripts.py) touch only one request's keys (its hash tag), or
one conversation's, so they stay valid on a Redis Cluster; the answer record for the done
stream is a separate step, written only by the call that ended the request (see
`finish_result`). A conversation's active key is written here too: taken by `submitted`,
released by the recorder's `conversation_released` once the answer is stored, or taken by
the next question's `submitted`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from redis.exceptions import ResponseError

from contract import protocol
from contract import transition_scripts as scripts
from contract.protocol import Answer, EventType, Keys, State, WorkItem

# Replies of `finish`.
ENDED_NOW, ALREADY_ENDED, LOST = 1, 0, -1
# Replies of `delta`: written (or written before), another attempt owns the request, written
# but the user pressed Stop.
WRITTEN, NOT_OWNER, WRITTEN_STOPPED = 1, 0, 2
# Replies of `start`, first element.
STARTED, START_ENDED, START_STOPPED, START_EXHAUSTED = 1, 0, 2, 3


@dataclass(frozen=True)
class Start:
    """What `start` found: run the attempt (`code` STARTED), or not, and why."""

    code: int
    attempt: int = 0  # every start counts here
    charged: int = 0  # those not handed back: what `max_attempts` limits


# -- the web ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstEvent:
    """A new request's first event as `submitted` queued it: its fields, and where in the
    pipeline's replies its id lands (a reader that starts after it needs no catch-up read)."""

    reply_index: int
    fields: dict


def submitted(
    pipe,
    keys: Keys,
    item: WorkItem,
    *,
    citations: list,
    stream: str,
    submit_by_ms: int,
    api_key: str = "",
    notice: str = "",
) -> FirstEvent:
    """A new request: its state, the conversation's active request, the first event for
    readers, and the admission entry. `submit_by_ms`: the web gives up waiting for Redis by
    then, so an entry Redis only runs later (it was frozen) is withdrawn by the dispatcher.
    `api_key`: the SHA-256 of the API key it came with, which the recorder files its usage
    under (the hash PostgreSQL stores, never the key). `notice`: what the person is told beside
    the answer (retrieval was unavailable), in the first event and the state."""
    cited = json.dumps(citations)
    now = protocol.now_ms()
    request_key, out_key = keys.request(item.id), keys.output(item.id)
    mapping = {
        "state": State.QUEUED,
        "user_id": item.user_id,
        "conversation_id": item.conversation_id,
        "kind": item.kind,
        "created_ms": now,
        "updated_ms": now,
        "citations": cited,
        "purpose": json.dumps(item.purpose) if item.purpose else "",
    }
    if api_key:
        mapping["api_key"] = api_key
    if notice:
        mapping["notice"] = notice
    pipe.hset(request_key, mapping=mapping)
    pipe.expire(request_key, protocol.REQUEST_TTL_SECONDS)
    if item.conversation_id:  # a stateless API request belongs to no conversation
        pipe.set(
            keys.conversation_active(item.conversation_id), item.id, ex=protocol.REQUEST_TTL_SECONDS
        )
    fields = {"type": EventType.STATUS, "state": State.QUEUED, "citations": cited}
    if notice:
        fields["notice"] = notice
    first = FirstEvent(len(pipe), fields)
    _event(pipe, out_key, first.fields)
    pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)
    pipe.xadd(stream, {**item.to_fields(), "submit_by_ms": str(submit_by_ms)})
    return first


def stopped(pipe, keys: Keys, request_id: str) -> None:
    """The user pressed Stop: the flag a worker checks between batches, and a note to the
    dispatcher, whose sweep ends the request at once if it is still waiting in line."""
    pipe.set(keys.cancel(request_id), "1", ex=protocol.CANCEL_TTL_SECONDS)
    pipe.sadd(keys.cancels, request_id)
    pipe.expire(keys.cancels, protocol.ADMISSION_STATE_TTL_SECONDS)


def conversation_released(pipe, keys: Keys, *, conversation_id: int | str, request_id: str) -> None:
    """The conversation may take its next question: its active key goes, but only while it still
    holds this request (no race with a new question that took the conversation meanwhile)."""
    pipe.eval(scripts.RELEASE_IF_HELD, 1, keys.conversation_active(conversation_id), request_id)


def answer_stored(pipe, keys: Keys, request_id: str) -> None:
    """The web stored the ended answer itself (a question came before the recorder did): the
    recorder reads this mark with the request and skips its own insert. The TTL is written
    again so a hash that expired meanwhile is not brought back for good."""
    request_key = keys.request(request_id)
    pipe.hset(request_key, "stored", "1")
    pipe.expire(request_key, protocol.REQUEST_TTL_SECONDS)


def conversation_erased(pipe, keys: Keys, *, conversation_id: int | str) -> None:
    """A deleted conversation holds no request any more (the one it held was stopped)."""
    pipe.delete(keys.conversation_active(conversation_id))


def request_erased(pipe, keys: Keys, request_id: str) -> None:
    """A deleted conversation's request: its state and its event stream (which holds the answer's
    text) go now instead of with their TTLs."""
    pipe.delete(keys.request(request_id))
    pipe.delete(keys.output(request_id))


# -- the dispatcher ---------------------------------------------------------------------------


def dispatched(pipe, keys: Keys, request_id: str, *, stream: str, fields: dict[str, str]) -> None:
    """The request leaves the line for a work stream (unless it has moved on already)."""
    pipe.xadd(stream, fields)
    pipe.eval(
        scripts.DISPATCHED,
        2,
        keys.request(request_id),
        keys.output(request_id),
        protocol.now_ms(),
        protocol.REQUEST_TTL_SECONDS,
        protocol.OUTPUT_TTL_SECONDS,
        protocol.OUTPUT_MAXLEN,
        stream,
    )


def position(
    pipe, keys: Keys, request_id: str, *, place: int, eta_seconds: int, reason: str = ""
) -> None:
    """ "You are #3 in line (about 12 s)", and why, when the plan's rate holds it."""
    event = {
        "type": EventType.STATUS,
        "state": State.QUEUED,
        "position": str(place),
        "eta_seconds": str(eta_seconds),
    }
    if reason:
        event["reason"] = reason
    out_key = keys.output(request_id)
    _event(pipe, out_key, event)
    pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)


# -- workers ----------------------------------------------------------------------------------


def start(
    pipe,
    keys: Keys,
    request_id: str,
    *,
    token: str,
    worker_id: str,
    max_attempts: int = 0,
    prompt_tokens: int = 0,
) -> None:
    """Claims the request for a new attempt; read the reply with `start_result`. The start
    event tells readers how many `prompt_tokens` the model reads before it answers."""
    pipe.eval(
        scripts.START,
        3,
        keys.request(request_id),
        keys.output(request_id),
        keys.cancel(request_id),
        token,
        worker_id,
        protocol.now_ms(),
        protocol.REQUEST_TTL_SECONDS,
        protocol.OUTPUT_TTL_SECONDS,
        protocol.OUTPUT_MAXLEN,
        max_attempts,
        prompt_tokens,
    )


def start_result(reply) -> Start:
    if not reply:  # the script's early `return 0`: the request has ended
        return Start(START_ENDED)
    return Start(int(reply[0]), int(reply[1]), int(reply[2]))


def vanished(pipe, keys: Keys, request_id: str) -> None:
    """Whether the request's last attempt vanished: it started and neither ended nor was handed
    back, so its worker died or was paused past its claim (worker/isolation.py). Reply: 0 or 1."""
    pipe.hexists(keys.request(request_id), "owner")


def released(pipe, keys: Keys, request_id: str, *, token: str) -> None:
    """The attempt `token` hands its request back unfinished (its worker is stopping): it owns
    it no more, and the start is not charged against the request's attempts."""
    pipe.eval(scripts.RELEASE, 1, keys.request(request_id), token)


def delta(
    pipe,
    keys: Keys,
    request_id: str,
    *,
    token: str,
    text: str,
    batch: int,
    logprobs: list[dict] | None = None,
) -> None:
    """Batch number `batch` (1, 2, ...) of the answer's text, written only while `token` owns
    the request, and once: the reply is WRITTEN, WRITTEN_STOPPED (the user pressed Stop), or
    NOT_OWNER when another attempt took over (the caller has lost its claim). `logprobs`: its
    tokens' log probabilities, for a request that asks for them (the entry then has a
    `logprobs` field; others are as before)."""
    pipe.eval(
        scripts.DELTA,
        3,
        keys.request(request_id),
        keys.output(request_id),
        keys.cancel(request_id),
        token,
        protocol.OUTPUT_MAXLEN,
        text,
        batch,
        *(() if logprobs is None else (json.dumps(logprobs),)),
    )


def finish(pipe, keys: Keys, answer: Answer, *, token: str = "") -> None:
    """Ends the request with `answer`: the final event and the end state, once. `token` is the
    attempt's ("" for the dispatcher ending a request no attempt runs). Read the reply with
    `finish_result`; then, only for ENDED_NOW, queue `answer_record`."""
    final = protocol.final_fields(answer)
    pairs = [part for name_value in final.items() for part in name_value]
    retry_after = "" if answer.retry_after is None else str(int(answer.retry_after))
    pipe.eval(
        scripts.FINISH,
        2,
        keys.request(answer.id),
        keys.output(answer.id),
        token,
        protocol.now_ms(),
        protocol.REQUEST_TTL_SECONDS,
        protocol.OUTPUT_TTL_SECONDS,
        protocol.OUTPUT_MAXLEN,
        str(answer.state),
        answer.error,
        json.dumps(asdict(answer.usage)),
        retry_after,
        *pairs,
    )


def finish_result(reply) -> int:
    """ENDED_NOW (this call ended it; also when an attempt resends its own finish after a lost
    reply), ALREADY_ENDED, or LOST (another attempt owns it)."""
    return int(reply)


def answer_record(pipe, keys: Keys, answer: Answer) -> None:
    """The record the recorder stores in PostgreSQL and the dispatcher settles charges from.
    Written after `finish` answered ENDED_NOW; a record written twice is stored once."""
    pipe.xadd(keys.done, answer.to_fields(), maxlen=protocol.DONE_MAXLEN, approximate=True)


def work_done(pipe, stream: str, entry_id: str) -> None:
    """The work item is finished with: acknowledged and deleted, so a work stream holds only
    work not yet finished (the dispatcher counts its length as work waiting or running)."""
    pipe.xack(stream, protocol.WORKER_GROUP, entry_id)
    pipe.xdel(stream, entry_id)


def work_returned(pipe, keys: Keys, stream: str, entry_id: str, fields: dict[str, str]) -> None:
    """A work item this worker will not run (it is stopping, or the stream's owner left) goes
    back to its model's shared stream for any other worker serving that model, marked as
    returned: no longer a first delivery (worker/ahead.py)."""
    pipe.xadd(keys.work_for_model(fields.get("model", "")), {**fields, protocol.RETURNED: "1"})
    work_done(pipe, stream, entry_id)


# -- anyone -----------------------------------------------------------------------------------


def dead_letter(
    pipe,
    keys: Keys,
    *,
    source: str,
    reason: str,
    stream: str = "",
    entry_id: str = "",
    fields: dict | None = None,
) -> None:
    """Keeps what could not be parsed, stored or run, with the reason, for an operator: no
    loop dies on data, and nothing is dropped silently."""
    fields = fields or {}
    pipe.xadd(
        keys.dead,
        {
            "source": source,
            "reason": reason[:500],
            "stream": stream,
            "entry_id": entry_id,
            "request_id": str(fields.get("id", "")),
            "at_ms": protocol.now_ms(),
            "fields": json.dumps(fields, default=str),
        },
        maxlen=protocol.DEAD_MAXLEN,
        approximate=True,
    )


def dead_letter_retried(
    pipe, keys: Keys, entry_id: str, *, stream: str, fields: dict[str, str]
) -> None:
    """An operator put a dead letter back on its stream, as it was first written."""
    pipe.xadd(stream, fields)
    pipe.xdel(keys.dead, entry_id)


def dead_letter_discarded(pipe, keys: Keys, entry_id: str) -> None:
    pipe.xdel(keys.dead, entry_id)


def ensure_groups(pipe, groups: Iterable[tuple[str, str]]) -> None:
    """Creates each (stream, group) that is missing, streams too; check the replies with
    `check_groups` (a group that exists already is not an error)."""
    for stream, group in groups:
        pipe.xgroup_create(stream, group, id="0", mkstream=True)


def check_groups(replies: list) -> None:
    for reply in replies:
        if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
            raise reply


def is_missing_group(exc: Exception) -> bool:
    """A read failed because its stream or group is gone (deleted, or Redis restarted empty)."""
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


def _event(pipe, out_key: str, event: dict) -> None:
    pipe.xadd(out_key, event, maxlen=protocol.OUTPUT_MAXLEN, approximate=True)
