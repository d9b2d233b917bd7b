"""Request kinds: what a request is, decided by the server, never taken from the client.

    chat        a person's question
    rag         a person's question with retrieved passages attached to its prompt
    long        a person's question whose prompt is over its plan's `long_prompt_tokens`
    background  work Sluice starts itself (summaries, follow-ups, titles, tag proposals): it
                waits behind every person's request, stays in line while the service degrades,
                and is dropped quietly when its purpose's `wait_s` runs out

The web knows whether passages were attached and whether Sluice itself asked (`web_kind`); the
dispatcher knows the plan, so it decides `long` (`kind_decide`). A plan's `cost_weights` price
each kind: its requests and tokens count that many times against the plan's buckets, and its
place in the fair queue costs as much.
"""

from __future__ import annotations

import json

CHAT, RAG, LONG, BACKGROUND = "chat", "rag", "long", "background"
KINDS = (CHAT, RAG, LONG, BACKGROUND)
PERSON_KINDS = frozenset({CHAT, RAG, LONG})
# Submitted by the OpenAI-compatible API: a person's request that belongs to no conversation
# (its caller sends the whole history each time); charged as chat or long.
API = "api"
# May belong to no conversation: the API's, and background work (its answer goes to its task).
STATELESS = frozenset({API, BACKGROUND})


def web_kind(*, requested: str, passages: int = 0) -> str:
    """The kind the web submits. `requested` is what Sluice's own code set (background work
    names itself, and so do a prompt built with passages and the API); anything else is a
    person's chat. `passages`: how many retrieved passages the prompt carries."""
    if requested in (BACKGROUND, API):
        return requested
    return RAG if passages > 0 or requested == RAG else CHAT


def kind_decide(*, submitted: str, prompt_tokens: int, long_prompt_tokens: int) -> str:
    """The kind the dispatcher charges: a person's request whose prompt is over the plan's
    size is `long`; background stays background; an unknown kind (an older web) is chat."""
    if submitted == BACKGROUND:
        return BACKGROUND
    if long_prompt_tokens and prompt_tokens > long_prompt_tokens:
        return LONG
    return submitted if submitted in PERSON_KINDS else CHAT


def is_background(kind: str) -> bool:
    return kind == BACKGROUND


# How long background work waits in line when its task names no limit of its own.
BACKGROUND_WAIT_SECONDS = 600


def background_deadline_ms(fields: dict[str, str], submitted_ms: int) -> int:
    """When a background request still waiting is dropped: its purpose's `wait_s` (a
    follow-up is worth little minutes later, a summary waits longer), else the default."""
    try:
        wait_s = float(json.loads(fields.get("purpose") or "{}").get("wait_s"))
    except (AttributeError, TypeError, ValueError):
        wait_s = BACKGROUND_WAIT_SECONDS
    return submitted_ms + int(max(1.0, wait_s) * 1000)
