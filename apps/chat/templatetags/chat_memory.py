from __future__ import annotations

from django import template

from apps.chat.models import Conversation
from apps.chat.prompt.memory import summary_for

register = template.Library()


@register.inclusion_tag("chat/_memory_note.html")
def memory_note(conversation: Conversation | None) -> dict:
    """The conversation's "what I remember" note: its rolling summary, when it has one."""
    summary = summary_for(conversation=conversation) if conversation else None
    return {"summary": summary, "conversation": conversation}
