"""Builds the model's messages for a conversation: a system prompt personalised from the user's
profile and tags, then the most recent turns that fit the model's context window."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from .models import Conversation
from .selectors import PromptProfile, prompt_profile, prompt_sources

# Turns read per prompt: far more than a small model's window holds, and one bounded query.
HISTORY_TURNS_MAX = 100

BASE_SYSTEM_PROMPT = (
    "You are Sluice, a helpful, honest assistant. Answer clearly and concisely. "
    "If you do not know, say so."
)


def estimate_tokens(text: str) -> int:
    """About four characters a token for English text, plus a few for the chat template."""
    return len(text) // 4 + 4


@dataclass
class Prompt:
    messages: list[dict[str, str]]
    prompt_tokens_estimate: int
    max_tokens: int


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
    *, conversation: Conversation, extra_system: str = "", max_tokens: int | None = None
) -> Prompt:
    """The system prompt, then as many of the latest turns as the context window holds."""
    max_tokens = max_tokens or settings.MODEL_MAX_TOKENS
    sources = prompt_sources(conversation=conversation, limit=HISTORY_TURNS_MAX)
    system = system_prompt(sources.profile)
    if extra_system:
        system = f"{system}\n\n{extra_system}"
    budget = settings.MODEL_CONTEXT_TOKENS - max_tokens - estimate_tokens(system)
    turns: list[dict[str, str]] = []
    for role, text in sources.history:
        cost = estimate_tokens(text)
        if cost > budget:
            if not turns:  # the latest question alone is too long: keep its end
                keep = max(0, budget - 4) * 4
                turns.append({"role": role, "content": text[-keep:]})
            break
        budget -= cost
        turns.append({"role": role, "content": text})
    turns.reverse()
    messages = [{"role": "system", "content": system}, *turns]
    used = sum(estimate_tokens(m["content"]) for m in messages)
    return Prompt(messages=messages, prompt_tokens_estimate=used, max_tokens=max_tokens)
