"""What the operations tests share: requests submitted as the web does, and a Redis client that
counts its round trips."""

from __future__ import annotations

from apps.chat.services import conversation_create
from apps.chat.submission import request_publish
from contract.protocol import WorkItem, new_request_id
from core.redis_client import get_redis
from tests.admission.conftest import keys
from tests.conftest import wait_until


def submit(user, *, conversation=None, max_tokens: int = 16, prompt_tokens: int = 20) -> str:
    """A question in a conversation of `user`'s, handed to admission as the web does."""
    conversation = conversation or conversation_create(owner=user, title="ops test")
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=max_tokens,
        temperature=0.0,
        prompt_tokens_estimate=prompt_tokens,
    )
    request_publish(item=item)
    return item.id


def final_event(request_id: str) -> dict | None:
    events = get_redis().xrange(keys().output(request_id))
    return next((e for _, e in events if e.get("type") == "final"), None)


def until(condition, *, timeout: float = 60, step=None, interval: float = 0.05):
    """Runs `step` (a dispatcher pass, say) until `condition()` holds; fails after `timeout`."""
    return wait_until(condition, timeout=timeout, step=step, every=interval)


class CountingRedis:
    """The real client, counting round trips: each command sent alone, and each pipeline."""

    def __init__(self, client) -> None:
        self.client = client
        self.round_trips = 0

    def pipeline(self, *args, **kwargs):
        outer = self
        pipe = self.client.pipeline(*args, **kwargs)

        class Counted:
            def __getattr__(self, name):
                return getattr(pipe, name)

            def execute(self, *a, **k):
                outer.round_trips += 1
                return pipe.execute(*a, **k)

        return Counted()

    def __getattr__(self, name):
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.round_trips += 1
            return attribute(*args, **kwargs)

        return counted
