"""What storing a question and handing it to admission costs the web process, step by step.

    .venv/bin/python bench/submit.py [--messages 300]

`request_submit` (the websocket's and the API's entry point) on a conversation with a short
history, against embedded PostgreSQL and Redis under var/bench/submit: wall time and this
thread's CPU time per message, then each step alone. Nothing is generated (no dispatcher or
worker runs); each pass removes its question again so the history stays the same size.
Prints figures; asserts nothing.
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

from chatsite.stack import VAR_DIR, backing_services  # noqa: E402


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
    with backing_services(VAR_DIR / "bench" / "submit") as urls:
        os.environ.update(urls)
        os.environ["SLUICE_REDIS_PREFIX"] = f"benchsub{uuid.uuid4().hex[:6]}"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        run(args.messages)


def run(count: int) -> None:
    from harness import make_sessions

    from apps.chat import submission
    from apps.chat.models import Conversation, Message
    from apps.chat.prompting import prompt_build, system_prompt_for
    from apps.chat.services import message_create
    from apps.rag.services import retrieve_for_prompt
    from chatsite.redis_client import get_redis, keys

    _, conversation_id = make_sessions(1, prefix=f"sub{uuid.uuid4().hex[:6]}")[0]
    conversation = Conversation.objects.get(id=conversation_id)
    user = conversation.owner
    for n in range(6):  # three earlier turns
        role = "user" if n % 2 == 0 else "assistant"
        message_create(conversation=conversation, role=role, text="Tell me about rivers. " * 8,
                       request_id=None if role == "user" else uuid.uuid4().hex)  # fmt: skip
    client = get_redis()
    question = "How do rivers form?"

    def submit() -> None:
        submitted = submission.request_submit(user=user, conversation=conversation,
                                              text=question)  # fmt: skip
        client.delete(keys().conversation_active(conversation.id))
        Message.objects.filter(pk=submitted.user_message.pk).delete()

    def store() -> None:
        message = message_create(conversation=conversation, role="user", text=question)
        Message.objects.filter(pk=message.pk).delete()

    print(f"{count} messages on a conversation of 6 turns, one thread:")
    wall, cpu = timed("submit (+ the delete that resets)", submit, count)
    timed("  store the question (+ delete)", store, count)
    timed("  corpora the user may search", lambda: retrieve_for_prompt(user=user, query=question),
          count)  # fmt: skip
    timed("  system prompt (profile, tags)", lambda: system_prompt_for(user.pk), count)
    timed("  prompt (system prompt, history)", lambda: prompt_build(conversation=conversation),
          count)  # fmt: skip
    for key in client.scan_iter(match=f"{keys().prefix}:*", count=1000):
        client.delete(key)
    print(f"submit: {wall:.2f} ms wall, {cpu:.2f} ms cpu per message")


if __name__ == "__main__":
    main()
