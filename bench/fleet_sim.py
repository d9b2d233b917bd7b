"""The simulated fleet and workload of bench/fleet.py: the GPU timing model each worker runs, the
conversations that arrive, and the figures read back from Redis.

GPU model (milliseconds of simulated GPU time, times --time-scale): first token 20 ms + 0.4 ms
per prompt token the prefix cache does not hold (2,500 tokens/s of prefill), 25 ms per answer
token, each extra running sequence slowing both by 4 %, a prefix cache of 16,000 tokens per
worker (least recently used evicted), and worker 0 twice as slow as the others.

Workload: conversations on one of `corpora` topics, each prompt led by that topic's system
message (system prompt + retrieved passages, about 1,200 tokens), then the conversation's
earlier turns and the new question. 70 % simple questions (12-32 answer tokens), 30 % complex
(80-160), all with max_tokens 256 (the real length is set by a marker the simulated engine
reads). A conversation asks its next question after its previous answer, 3-8 turns, then a new
conversation starts. Arrivals are Poisson at `load` x the fleet's capacity with warm caches.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

FIRST_TOKEN_MS, PREFILL_MS, DECODE_MS, SLOWDOWN, KV_TOKENS = 20.0, 0.4, 25.0, 0.04, 16_000
SYSTEM_CHARS = 4800  # about 1,200 tokens
SIMPLE, COMPLEX = (12, 32), (80, 160)
MAX_TOKENS = 256


def worker_args(index: int, *, slots: int, time_scale: float) -> list[str]:
    """The simulated engine's options for worker `index` (0 is the slow one)."""
    return [
        "--engine",
        "simulated",
        "--slots",
        str(slots),
        "--sim-first-token-ms",
        str(FIRST_TOKEN_MS * time_scale),
        "--sim-prefill-ms-per-token",
        str(PREFILL_MS * time_scale),
        "--sim-decode-ms",
        str(DECODE_MS * time_scale),
        "--sim-batch-slowdown",
        str(SLOWDOWN),
        "--sim-kv-tokens",
        str(KV_TOKENS),
        "--sim-speed",
        "0.5" if index == 0 else "1.0",
    ]


def capacity(*, workers: int, slots: int, time_scale: float) -> float:
    """Answers per second the fleet serves with warm caches (only the new turn prefilled)."""
    tokens = 0.7 * sum(SIMPLE) / 2 + 0.3 * sum(COMPLEX) / 2
    new_prompt = 100  # the previous answer and the new question
    decode = DECODE_MS * tokens * (1 + SLOWDOWN * (slots - 1) * 0.8)
    service_ms = (FIRST_TOKEN_MS + PREFILL_MS * new_prompt + decode) * time_scale
    speed = (workers - 1) + 0.5
    return speed * slots / (service_ms / 1000)


@dataclass
class Conversation:
    id: int
    user_id: int
    topic: int
    turns_left: int
    messages: list[dict] = field(default_factory=list)
    busy: bool = False


class Workload:
    def __init__(
        self, *, conversation_ids: list[tuple[int, int]], corpora: int, active: int, seed: int
    ) -> None:
        self.random = random.Random(seed)
        self.fresh = list(conversation_ids)  # (conversation id, owner id) not used yet
        self.systems = [self._system(topic) for topic in range(corpora)]
        self.active = [self._start() for _ in range(active)]
        self.asked: dict[str, tuple[Conversation, int]] = {}  # request id → (conv, tokens)

    def _system(self, topic: int) -> str:
        passage = f"Passage on topic {topic}: the sluice gate {topic} holds water level {topic}. "
        return "You are Sluice's assistant. Answer from these sources.\n" + passage * (
            SYSTEM_CHARS // len(passage)
        )

    def _start(self) -> Conversation:
        conversation_id, owner = self.fresh.pop()
        topic = self.random.randrange(len(self.systems))
        return Conversation(
            conversation_id,
            owner,
            topic,
            self.random.randint(3, 8),
            [{"role": "system", "content": self.systems[topic]}],
        )

    def next_question(self) -> tuple[Conversation, list[dict], int, bool] | None:
        """A conversation that is not waiting for an answer asks its next question."""
        idle = [c for c in self.active if not c.busy]
        if not idle:
            return None
        conversation = self.random.choice(idle)
        complex_ = self.random.random() < 0.3
        tokens = self.random.randint(*(COMPLEX if complex_ else SIMPLE))
        turn = len(conversation.messages)
        if complex_:
            text = (
                f"Explain in detail, step by step, how part {turn} of topic "
                f"{conversation.topic} works, and list the trade-offs. "
            )
        else:
            text = f"What is item {turn} of topic {conversation.topic}? "
        question = {"role": "user", "content": f"{text}[[sim:tokens={tokens}]]"}
        conversation.busy = True
        return conversation, [*conversation.messages, question], tokens, complex_

    def asked_as(
        self, request_id: str, conversation: Conversation, messages: list[dict], tokens: int
    ) -> None:
        conversation.messages = messages
        self.asked[request_id] = (conversation, tokens)

    def answered(self, request_id: str) -> None:
        """Its answer joins the history; a conversation out of turns makes way for a new one."""
        found = self.asked.pop(request_id, None)
        if found is None:
            return
        conversation, tokens = found
        conversation.messages.append({"role": "assistant", "content": "answer " * tokens})
        conversation.busy = False
        conversation.turns_left -= 1
        if conversation.turns_left <= 0 and self.fresh:
            self.active[self.active.index(conversation)] = self._start()


@dataclass
class Request:
    id: str
    submitted_ms: int
    first_ms: int | None = None
    final_ms: int | None = None
    state: str = ""


def read_timings(client, keys, requests: list[Request]) -> None:
    """When each request's first text and its end were written. The end is the final event's
    stream entry id (Redis's clock in ms, the same machine's clock as the submission times);
    the first token is the end less the generation's duration plus its engine TTFT (both in
    the final event's usage), since queue-position events may come before any text."""
    pipe = client.pipeline(transaction=False)
    for request in requests:
        pipe.xrevrange(keys.output(request.id), count=1)
    for request, tail in zip(requests, pipe.execute(), strict=True):
        if not tail or tail[0][1].get("type") != "final":
            continue
        entry_id, fields = tail[0]
        request.final_ms = int(entry_id.split("-")[0])
        request.state = fields.get("state", "")
        usage = json.loads(fields.get("usage") or "{}")
        if usage.get("ttft_ms") is not None and usage.get("duration_ms") is not None:
            request.first_ms = int(request.final_ms - usage["duration_ms"] + usage["ttft_ms"])


def worker_loads(client, keys, worker_ids: list[str], slots: int) -> list[float]:
    """Each worker's load now: answers running plus work waiting on its own stream, per slot
    (a load balancer's queue is at the worker; pull's queue is shared and counts for none)."""
    pipe = client.pipeline(transaction=False)
    pipe.mget([keys.heartbeat(w) for w in worker_ids])
    for worker_id in worker_ids:
        pipe.xlen(keys.work_for(worker_id))
        pipe.xpending(keys.work_for(worker_id), "workers")
    replies = pipe.execute(raise_on_error=False)
    beats, rest = replies[0], replies[1:]
    loads = []
    for beat, length, pending in zip(beats, rest[0::2], rest[1::2], strict=True):
        busy = int(json.loads(beat).get("busy", 0)) if beat else 0
        read = pending.get("pending", 0) if isinstance(pending, dict) else 0
        waiting = max(0, (length if isinstance(length, int) else 0) - read)
        loads.append((busy + waiting) / slots)
    return loads


def engine_figures(client, keys, worker_ids: list[str]) -> dict[str, dict]:
    """Each worker's engine figures from its last heartbeat, with when it was taken (`at_s`)."""
    found = {}
    for worker_id, raw in zip(
        worker_ids, client.mget([keys.heartbeat(w) for w in worker_ids]), strict=True
    ):
        beat = json.loads(raw) if raw else {}
        found[worker_id] = {
            **(beat.get("engine_metrics") or {}),
            "at_s": beat.get("at_ms", 0) / 1000,
        }
    return found
