"""What storing a question and handing it to admission costs the web process, step by step.

    .venv/bin/python bench/submit.py [--messages 300]

`request_submit` (the websocket's and the API's entry point) against embedded PostgreSQL and
Redis under var/bench/submit: wall time, this thread's CPU time and PostgreSQL statements per
message, with the Redis hot tier off (HOT_TIER=false: history, profile and the corpora the
user may search read from PostgreSQL) and on (warm: read from Redis; only the question's
INSERT reaches PostgreSQL), side by side in one run. Nothing is generated (no
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


def run(count: int) -> None:
    from django.conf import settings
    from harness import make_sessions

    from apps.chat import submission
    from apps.chat.models import Conversation
    from apps.chat.prompt.prompting import prompt_build
    from apps.chat.services import message_create
    from apps.rag.services import retrieve_for_prompt
    from core.redis_client import get_redis, keys

    client = get_redis()
    question = "How do rivers form?"
    queries = QueryCounter()

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

    def measure(hot_tier: bool) -> tuple[float, float, float]:
        """One conversation per mode; its history grows by one question a pass (the hot tier
        is written through, so nothing is deleted to reset it)."""
        settings.HOT_TIER = hot_tier
        conversation = conversation_with_history()
        user = conversation.owner
        active = keys().conversation_active(conversation.id)

        def submit() -> None:
            submission.request_submit(
                submission.Question(user=user, conversation=conversation, text=question)
            )
            client.delete(active)

        label = "on " if hot_tier else "off"
        before = queries.count
        wall, cpu = timed(f"submit, hot tier {label}", submit, count)
        per_message = (queries.count - before) / (count + 1)
        print(f"{'':<34} {per_message:.1f} PostgreSQL statements per message")
        timed(
            f"  prompt only, hot tier {label}",
            lambda: prompt_build(conversation=conversation),
            count,
        )
        return wall, cpu, per_message

    print(f"{count} messages per mode, one thread, growing conversations of 6+ turns:")
    searcher = conversation_with_history().owner
    timed(
        "  corpora the user may search",
        lambda: retrieve_for_prompt(user=searcher, query=question),
        count,
    )
    off = measure(False)
    on = measure(True)
    for key in client.scan_iter(match=f"{keys().prefix}:*", count=1000):
        client.delete(key)
    print(
        f"submit: cpu {off[1]:.2f} -> {on[1]:.2f} ms per message ({off[1] / on[1]:.2f}x), "
        f"wall {off[0]:.2f} -> {on[0]:.2f} ms, PostgreSQL statements {off[2]:.1f} -> "
        f"{on[2]:.1f} per message (hot tier off -> on)"
    )


if __name__ == "__main__":
    main()
