"""Request kinds: what a request is, decided by the server, never taken from the client.

    chat        a person's question
    rag         a person's question with retrieved passages attached to its prompt
    long        a person's question whose prompt is over its plan's `long_prompt_tokens`
    background  work Sluice starts itself (summaries, follow-ups, tag proposals): it waits
                behind every person's request and is refused while the service degrades

The web knows whether passages were attached and whether Sluice itself asked (`web_kind`); the
dispatcher knows the plan, so it decides `long` (`kind_decide`). A plan's `cost_weights` price
each kind: its requests and tokens count that many times against the plan's buckets, and its
place in the fair queue costs as much.
"""

from __future__ import annotations

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
