"""`{% user_files %}`: the signed-in user's own files, for the profile page (accounts renders the
page but may not import rag: the block comes from here); `{% user_file_max_bytes %}` for the
chat page's attach.js."""

from __future__ import annotations

from django import template
from django.conf import settings

from apps.rag.user_files import user_file_list_for_user, user_file_state

register = template.Library()


@register.inclusion_tag("rag/_user_files.html", takes_context=True)
def user_files(context) -> dict:
    user = context["request"].user
    entries = list(user_file_list_for_user(user=user)) if user.is_authenticated else []
    return {
        "files": [(entry, user_file_state(entry)) for entry in entries],
        "csrf_token": context.get("csrf_token"),
    }


@register.simple_tag
def user_file_max_bytes() -> int:
    """The largest file a user may attach (attach.js refuses larger ones before uploading)."""
    return settings.RAG_USER_FILE_MAX_BYTES
