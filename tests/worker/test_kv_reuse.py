"""The llama.cpp engine reuses a conversation's KV cache across its turns (the real GGUF)."""

from __future__ import annotations

import pytest

from worker.engines import create_engine
from worker.engines.base import EngineRequest

SYSTEM = {"role": "system", "content": "You are Sluice, a helpful, honest assistant. " * 8}


@pytest.fixture
async def two_slots():
    engine = create_engine("llamacpp", slots=2)
    await engine.start()
    yield engine
    await engine.stop()


async def ask(engine, request_id: str, messages: list[dict]) -> tuple[str, tuple[int, int]]:
    request = EngineRequest(id=request_id, messages=messages, max_tokens=24, temperature=0.0)
    outputs = [o async for o in engine.generate(request)]
    # Each output reports the same counts the engine keeps (the answer's usage carries them).
    assert (outputs[-1].prompt_tokens, outputs[-1].cached_tokens) == engine.last_prompt
    return "".join(o.text for o in outputs), engine.last_prompt


def follow_up(first: list[dict], answer: str, question: str) -> list[dict]:
    return [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


@pytest.mark.slow
async def test_a_follow_up_turn_reads_only_the_new_tokens(two_slots):
    first = [SYSTEM, {"role": "user", "content": "Name a large river in Europe."}]
    other = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What colour is grass?"},
    ]
    answer, (prompt, cached) = await ask(two_slots, "a1", first)
    assert prompt > 100 and cached == 0
    # Another conversation in between takes the other slot, not this conversation's cache.
    await ask(two_slots, "b1", other)
    _, (prompt2, cached2) = await ask(two_slots, "a2", follow_up(first, answer, "How long is it?"))
    assert prompt2 > prompt
    # Everything up to the new question comes from the cache: the turn reads only its tail.
    assert cached2 >= prompt - 1
    assert prompt2 - cached2 < 40
    metrics = (await two_slots.health()).metrics
    assert metrics["cached_tokens"] >= cached2


@pytest.mark.slow
async def test_a_changed_history_is_read_again(two_slots):
    first = [SYSTEM, {"role": "user", "content": "Name a large river in Europe."}]
    answer, _ = await ask(two_slots, "c1", first)
    edited = [{"role": "system", "content": "Another system prompt entirely."}, *first[1:]]
    _, (prompt2, cached2) = await ask(two_slots, "c2", follow_up(edited, answer, "And in Asia?"))
    # Only the template's opening tokens can match: the rest is read again.
    assert cached2 < 10 < prompt2
