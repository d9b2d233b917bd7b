"""Builds the model's messages for a conversation: a system prompt personalised from the user's
profile and tags, then the most recent turns that fit the model's context window."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from apps.accounts.models import Profile, User

from .models import Conversation, Message

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


def system_prompt_for(user: User) -> str:
    lines = [BASE_SYSTEM_PROMPT]
    profile = Profile.objects.filter(user=user).prefetch_related("tags").first()
    if profile:
        if profile.display_name:
            lines.append(f"The user's name is {profile.display_name}.")
        if profile.language and profile.language.lower() != "english":
            lines.append(f"Answer in {profile.language}.")
        lines.append(f"The user's expertise level is {profile.get_expertise_display().lower()}.")
        if profile.about:
            # Quoted, as it is the user's own text, not an instruction to follow blindly.
            lines.append(f'The user says about themselves: "{profile.about.strip()}"')
        lines.extend(
            tag.prompt_hint for tag in profile.tags.all() if tag.is_active and tag.prompt_hint
        )
    return "\n".join(lines)


def prompt_build(
    *, conversation: Conversation, extra_system: str = "", max_tokens: int | None = None
) -> Prompt:
    """The system prompt, then as many of the latest turns as the context window holds."""
    max_tokens = max_tokens or settings.MODEL_MAX_TOKENS
    system = system_prompt_for(conversation.owner)
    if extra_system:
        system = f"{system}\n\n{extra_system}"
    budget = settings.MODEL_CONTEXT_TOKENS - max_tokens - estimate_tokens(system)
    turns: list[dict[str, str]] = []
    recent = conversation.messages.filter(
        role__in=[Message.Role.USER, Message.Role.ASSISTANT], status=Message.Status.DONE
    ).order_by("-created", "-id")
    for message in recent.iterator(chunk_size=50):
        cost = estimate_tokens(message.text)
        if cost > budget:
            if not turns:  # the latest question alone is too long: keep its end
                keep = max(0, budget - 4) * 4
                turns.append({"role": message.role, "content": message.text[-keep:]})
            break
        budget -= cost
        turns.append({"role": message.role, "content": message.text})
    turns.reverse()
    messages = [{"role": "system", "content": system}, *turns]
    used = sum(estimate_tokens(m["content"]) for m in messages)
    return Prompt(messages=messages, prompt_tokens_estimate=used, max_tokens=max_tokens)
