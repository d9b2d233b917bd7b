"""Builds the model's messages for a conversation: a system prompt personalised from the user's
profile and tags, what the conversation remembers of older turns (see memory.py), then the most
recent turns that fit the model's context window (the conversation's model's, as its workers
report it: apps/admission/selectors.model_context_tokens).

The layout serves prefix caching: what changes least comes first (system prompt, profile,
summary), then the turns in order, then this question's passages, in a message of their own just
before the question. A follow-up then repeats its predecessor's prompt up to the previous
question, so the engine that served it skips all of that (bench/fleet.py measures the layouts);
passages inside the system message would change the prompt's first message on every turn."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from apps.admission.selectors import model_context_tokens
from apps.chat.models import Conversation
from apps.chat.prompt.memory import Remembered, Turn, estimate_tokens, plan_prompt
from apps.chat.selectors import PromptProfile, PromptSources, prompt_profile, prompt_sources

__all__ = ["Prompt", "estimate_tokens", "prompt_build", "system_prompt", "system_prompt_for"]

# Turns read per prompt: far more than a small model's window holds, and one bounded query.
HISTORY_TURNS_MAX = 100

BASE_SYSTEM_PROMPT = (
    "You are Sluice, a helpful, honest assistant. Answer clearly and concisely. "
    "If you do not know, say so."
)


@dataclass
class Prompt:
    messages: list[dict[str, str]]
    prompt_tokens_estimate: int
    max_tokens: int
    # Turns due to be folded into the conversation's summary (oldest first), and the summary
    # they extend: the caller asks for that summary once the prompt's own request is sent.
    to_summarise: list[Turn] = field(default_factory=list)
    summary: str = ""
    summary_upto: int = 0
    # The memory block it holds, part by part (what the page's "What I remember" shows).
    remembered: Remembered = field(default_factory=Remembered)


def system_prompt_for(user_id: int) -> str:
    return system_prompt(prompt_profile(user_id=user_id))


def system_prompt(profile: PromptProfile | None) -> str:
    lines = [BASE_SYSTEM_PROMPT]
    if profile:
        if profile.display_name:
            lines.append(f"The user's name is {profile.display_name}.")
        if profile.language and profile.language.lower() != "english":
            lines.append(f"Answer in {profile.language}.")
        lines.append(f"The user's expertise level is {profile.expertise.lower()}.")
        if profile.about:
            # Quoted, as it is the user's own text, not an instruction to follow blindly.
            lines.append(f'The user says about themselves: "{profile.about.strip()}"')
        lines.extend(hint for hint in profile.hints if hint)
    return "\n".join(lines)


def prompt_build(
    *,
    conversation: Conversation,
    extra_system: str = "",
    passages: str = "",
    max_tokens: int | None = None,
    sources: PromptSources | None = None,
) -> Prompt:
    """The system prompt, what the conversation remembers of older turns (summary, pinned and
    key-fact turns), then as many of the latest turns as the context window holds. `sources`:
    given by a caller that has them (bench/), else read from PostgreSQL. `passages`: this
    question's retrieved passages (rag/prompting.passages_block), placed just before the
    question."""
    max_tokens = max_tokens or settings.MODEL_MAX_TOKENS
    if sources is None:
        sources = prompt_sources(conversation=conversation, limit=HISTORY_TURNS_MAX)
    system = system_prompt(sources.profile)
    if extra_system:
        system = f"{system}\n\n{extra_system}"
    window = (
        model_context_tokens(model=conversation.model)
        if conversation is not None
        else settings.MODEL_CONTEXT_TOKENS  # a prompt of no stored conversation (bench/)
    )
    budget = window - max_tokens - estimate_tokens(system)
    if passages:
        budget -= estimate_tokens(passages)
    plan = plan_prompt(system=system, sources=sources, budget=budget)
    turns = plan.turns
    if passages:  # its own message, so the question stays the last one (estimates read it)
        cut = len(turns) - 1 if turns and turns[-1]["role"] == "user" else len(turns)
        turns = [*turns[:cut], {"role": "user", "content": passages}, *turns[cut:]]
    messages = [{"role": "system", "content": plan.system}, *turns]
    used = sum(estimate_tokens(m["content"]) for m in messages)
    return Prompt(
        messages=messages,
        prompt_tokens_estimate=used,
        max_tokens=max_tokens,
        to_summarise=plan.to_summarise,
        summary=sources.summary,
        summary_upto=sources.summary_upto,
        remembered=plan.remembered,
    )
