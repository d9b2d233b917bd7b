"""How the dispatcher ends requests no attempt runs: rejected, withdrawn, timed out or stopped in
line, unreadable, or lost with the worker that ran them.

`contract.transitions` writes the end. The finish scripts touch each request's own slot and the
answer record goes to the done stream, another slot, so a pass ends its requests in its own MULTI
and then, in a second round trip, records only those its finish actually ended (a request that
had ended already has its record).
"""

from __future__ import annotations

import redis

from apps.admission import outcomes
from contract import transitions
from contract.protocol import Answer, Keys, State


class Endings:
    """The requests one pass ends, queued on its pipeline."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self._ended: list[tuple[int, Answer]] = []  # (index of the finish reply, answer)

    def __bool__(self) -> bool:
        return bool(self._ended)

    def add(self, pipe, answer: Answer) -> None:
        self._ended.append((len(pipe), answer))
        transitions.finish(pipe, self.keys, answer)

    def record(self, client: redis.Redis, replies: list) -> list[Answer]:
        """Adds the answer records of the requests these finishes ended; returns those."""
        ended = [
            answer
            for index, answer in self._ended
            if transitions.finish_result(replies[index]) == transitions.ENDED_NOW
        ]
        if ended:
            pipe = client.pipeline(transaction=False)
            for answer in ended:
                transitions.answer_record(pipe, self.keys, answer)
            pipe.execute()
        self._ended = []
        return ended


def fail_unreadable(client: redis.Redis, keys: Keys, request_ids: list[str]) -> None:
    """Ends requests whose admission entry or queue record could not be read (they went to the
    dead-letter stream): their users see a failure instead of a question queued forever. The
    request hash names the user and the conversation; a request whose hash has expired is gone
    for its reader already."""
    if not request_ids:
        return
    pipe = client.pipeline(transaction=False)
    for request_id in request_ids:
        pipe.hmget(keys.request(request_id), "user_id", "conversation_id")
    owners = pipe.execute()
    endings = Endings(keys)
    pipe = client.pipeline(transaction=False)
    for request_id, (user_id, conversation_id) in zip(request_ids, owners, strict=True):
        if user_id:  # an API request belongs to no conversation: its id is ""
            endings.add(
                pipe,
                Answer(
                    id=request_id,
                    user_id=user_id,
                    conversation_id=conversation_id or "",
                    state=State.FAILED,
                    error=outcomes.unreadable(),
                ),
            )
    if endings:
        endings.record(client, pipe.execute())
