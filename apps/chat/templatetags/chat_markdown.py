"""The chat pages' template tags: model output as sanitised Markdown, and the conversation's
"What I remember" note."""

from __future__ import annotations

import logging

from django import template
from django.utils.safestring import mark_safe
from redis.exceptions import RedisError

from apps.chat import background
from apps.chat.models import Conversation
from apps.chat.prompt.prompting import prompt_build
from core.markdown import render_markdown

log = logging.getLogger("sluice.chat.templatetags")
register = template.Library()


@register.filter(name="markdown")
def markdown_filter(text: str) -> str:
    # Safe to mark: render_markdown escapes raw HTML and sanitises the result.
    return mark_safe(render_markdown(text))


@register.inclusion_tag("chat/_memory_note.html", takes_context=True)
def memory_note(context, conversation: Conversation | None) -> dict:
    """The memory block the conversation's next prompt holds, built by the code that builds
    prompts (with the latest turns as they stand and no passages), and whether a summary is
    still waiting to be written. Each entry can be corrected or deleted there."""
    if conversation is None or conversation.pk is None:
        return {"conversation": None}
    block = prompt_build(conversation=conversation).remembered
    try:
        pending = background.summary_pending(conversation_id=conversation.pk)
    except RedisError as exc:
        log.warning("summary state of conversation %s unknown: %s", conversation.pk, exc)
        pending = False
    request = context.get("request")
    return {
        "conversation": conversation,
        "block": block,
        "entries": [*block.facts, *block.others],
        "pending": pending,
        "open": bool(request and request.GET.get("memory")),
    }
