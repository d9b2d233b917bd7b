"""What storing a question and handing it to admission costs the web process, step by step.

    .venv/bin/python bench/submit.py [--messages 300]

`request_submit` (the websocket's and the API's entry point) against embedded PostgreSQL and
Redis under var/bench/submit: wall time, this thread's CPU time, PostgreSQL statements and Redis
round trips per message, for a conversation that grows by one question a pass; then its two
reads alone, the corpora the user may search and the prompt. Nothing is generated (no
dispatcher or worker runs). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from devstack.stack import VAR_DIR, backing_services  # noqa: E402


def timed(label: str, step: Callable[[], object], count: int) -> tuple[float, float]:
    step()  # warm: connections, caches
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(count):
        step()
    wall = (time.perf_counter() - wall) / count * 1000
    cpu = (time.thread_time() - cpu) / count * 1000
    print(f"{label:<34} wall {wall:6.2f} ms   cpu {cpu:6.2f} ms")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    os.environ["RAG_WARM_UP"] = "false"
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # a log line per message would be measured too
    with backing_services(VAR_DIR / "bench" / "submit") as urls:
        os.environ.update(urls)
        os.environ["SLUICE_REDIS_PREFIX"] = f"benchsub{uuid.uuid4().hex[:6]}"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        run(args.messages)


class QueryCounter:
    """Counts statements sent to PostgreSQL through any psycopg cursor (Django's and the plain
    ones the prompt's reads use)."""

    def __init__(self) -> None:
        import psycopg

        self.count = 0
        for name in ("execute", "executemany"):
            real = getattr(psycopg.Cursor, name)

            def counted(cursor, *args, _real=real, **kwargs):
                self.count += 1
                return _real(cursor, *args, **kwargs)

            setattr(psycopg.Cursor, name, counted)


class RoundTripCounter:
    """Counts packets sent to Redis: a command alone or a whole pipeline, one round trip each."""

    def __init__(self) -> None:
        import redis.connection

        self.count = 0
        real = redis.connection.AbstractConnection.send_packed_command

        def counted(connection, command, check_health=True):
            self.count += 1
            return real(connection, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = counted


def run(count: int) -> None:
    from harness import make_sessions

    from apps.chat import submission
    from apps.chat.models import Conversation
    from apps.chat.prompt.prompting import prompt_build
    from apps.chat.services import message_create
    from apps.rag.selectors import searchable_corpora_for_user
    from core.redis_client import get_redis, keys

    client = get_redis()
    question = "How do rivers form?"
    queries, round_trips = QueryCounter(), RoundTripCounter()

    def conversation_with_history() -> Conversation:
        _, conversation_id = make_sessions(1, prefix=f"sub{uuid.uuid4().hex[:6]}")[0]
        conversation = Conversation.objects.select_related("owner").get(id=conversation_id)
        for n in range(6):  # three earlier turns
            role = "user" if n % 2 == 0 else "assistant"
            message_create(
                conversation=conversation,
                role=role,
                text="Tell me about rivers. " * 8,
                request_id=None if role == "user" else uuid.uuid4().hex,
            )
        return conversation

    print(f"{count} messages, one thread, a conversation of 6+ turns growing by one a message:")
    conversation = conversation_with_history()
    user = conversation.owner
    active = keys().conversation_active(conversation.id)

    def submit() -> None:
        submission.request_submit(
            submission.Question(user=user, conversation=conversation, text=question)
        )
        client.delete(active)  # as if it was answered (one round trip, left out below)

    statements, trips = queries.count, round_trips.count
    wall, cpu = timed("submit", submit, count)
    statements = (queries.count - statements) / (count + 1)
    trips = (round_trips.count - trips) / (count + 1) - 1
    print(f"{'':<34} {statements:.1f} PostgreSQL statements, {trips:.1f} Redis round trips")
    timed("  corpora the user may search", lambda: searchable_corpora_for_user(user=user), count)
    timed("  prompt only", lambda: prompt_build(conversation=conversation), count)
    for key in client.scan_iter(match=f"{keys().prefix}:*", count=1000):
        client.delete(key)
    print(
        f"submit: cpu {cpu:.2f} ms per message, wall {wall:.2f} ms, PostgreSQL statements "
        f"{statements:.1f} and Redis round trips {trips:.1f} per message"
    )


if __name__ == "__main__":
    main()
