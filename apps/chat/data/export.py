"""Export: one conversation as Markdown or JSON, and all of a user's data as one JSON download;
import takes a conversation's JSON back (the export round-trips)."""

from __future__ import annotations

import json
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Profile, User
from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.prompt import memory_facts
from apps.chat.services import clean_title
from apps.inbox.models import InboxMessage
from apps.usage import selectors as usage_selectors

FORMAT = "sluice-conversation"
ALL_FORMAT = "sluice-export"
VERSION = 1
MESSAGE_FIELDS = (
    "role",
    "text",
    "status",
    "error",
    "citations",
    "prompt_tokens",
    "completion_tokens",
    "pinned",
)
IMPORT_MAX_MESSAGES = 5000


def _when(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def conversation_export_data(*, conversation: Conversation) -> dict:
    messages = list(conversation.messages.order_by("created", "id"))
    summary = ConversationSummary.objects.filter(conversation=conversation).first()
    # Messages by their place in the conversation: the summary covers those up to its last
    # turn in that order (ids are not the order: an answer stored with the next question may
    # have the higher id while it comes first), and memory entries name their turn by place.
    place = {m.id: n for n, m in enumerate(messages)}
    covers = place.get(summary.upto_message_id, -1) + 1 if summary else 0
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "model": conversation.model,
        "archived": conversation.archived,
        "created": _when(conversation.created),
        "updated": _when(conversation.updated),
        "messages": [
            {**{name: getattr(m, name) for name in MESSAGE_FIELDS}, "created": _when(m.created)}
            for m in messages
        ],
        # What the conversation remembers of older turns, and how many messages it covers.
        "summary": None
        if summary is None
        else {
            "text": summary.text,
            "model": summary.model,
            "covers": covers,
            "facts": [
                {**entry, "at": place.get(entry.get("at"), -1)}
                for entry in summary.facts
                if isinstance(entry, dict)
            ],
        },
    }


def conversation_export_json(*, conversation: Conversation) -> str:
    return json.dumps(
        conversation_export_data(conversation=conversation), indent=2, ensure_ascii=False
    )


def conversation_export_markdown(*, conversation: Conversation) -> str:
    """Readable text: the title, then each turn under who said it. Message text is kept as
    written (an answer is Markdown already)."""
    lines = [f"# {conversation.title}", "", f"_Exported from Sluice on {timezone.now():%Y-%m-%d}_"]
    for m in conversation.messages.order_by("created", "id"):
        who = {"user": "You", "assistant": "Sluice"}.get(m.role, m.role.title())
        lines += ["", f"## {who} · {m.created:%Y-%m-%d %H:%M}", "", m.text.rstrip()]
        if m.status != Message.Status.DONE:
            lines += ["", f"_({m.get_status_display()}{': ' + m.error if m.error else ''})_"]
        for c in m.citations or []:
            lines.append(
                f"- [{c.get('number', '')}] {c.get('title', '')} {c.get('source_url', '')}"
            )
    return "\n".join(lines) + "\n"


def user_export_all(*, user: User) -> dict:
    """Everything Sluice keeps about the user, in one document."""
    profile = Profile.objects.filter(user=user).prefetch_related("tags").first()
    conversations = Conversation.objects.filter(owner=user).order_by("created", "id")
    return {
        "format": ALL_FORMAT,
        "version": VERSION,
        "exported": _when(timezone.now()),
        "user": {
            "username": user.get_username(),
            "email": user.email,
            "date_joined": _when(user.date_joined),
        },
        "profile": None
        if profile is None
        else {
            "display_name": profile.display_name,
            "language": profile.language,
            "expertise": profile.expertise,
            "about": profile.about,
            "tags": [tag.name for tag in profile.tags.all()],
        },
        "conversations": [conversation_export_data(conversation=c) for c in conversations],
        "inbox": [
            {
                "kind": m.kind,
                "text": m.text,
                "data": m.data,
                "created": _when(m.created),
                "read": m.read_at is not None,
            }
            for m in InboxMessage.objects.filter(user=user).order_by("id")
        ],
        # Their votes on answers, with any comment (those on API answers too).
        "feedback": usage_selectors.feedback_for_user(user=user),
    }


@transaction.atomic
def conversation_import(*, owner: User, data: dict) -> Conversation:
    """A conversation from its JSON export, as a new conversation of `owner` (ids are never
    taken from the file). Raises ValidationError for anything that is not such an export."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValidationError("That is not a Sluice conversation export.", code="format")
    messages = data.get("messages")
    if not isinstance(messages, list) or len(messages) > IMPORT_MAX_MESSAGES:
        raise ValidationError("The export's messages cannot be read.", code="messages")
    conversation = Conversation.objects.create(
        owner=owner,
        title=clean_title(str(data.get("title") or "Imported chat")),
        model=str(data.get("model") or "")[:200],
        archived=bool(data.get("archived")),
    )
    rows = []
    for item in messages:
        if not isinstance(item, dict) or item.get("role") not in Message.Role.values:
            raise ValidationError("A message in the export cannot be read.", code="message")
        status = item.get("status") or Message.Status.DONE
        if status not in Message.Status.values:
            raise ValidationError("A message in the export has an unknown status.", code="status")
        rows.append(
            Message(
                conversation=conversation,
                role=item["role"],
                text=str(item.get("text") or ""),
                status=status,
                error=str(item.get("error") or "")[:300],
                citations=item.get("citations") if isinstance(item.get("citations"), list) else [],
                prompt_tokens=_count(item.get("prompt_tokens")),
                completion_tokens=_count(item.get("completion_tokens")),
                pinned=item.get("pinned") is True,
            )
        )
    created = Message.objects.bulk_create(rows)
    # Keep the original times (auto_now_add set them to now on insert).
    for message, item in zip(created, messages, strict=True):
        when = _parse_time(item.get("created"))
        if when:
            message.created = when
    Message.objects.bulk_update(created, ["created"])
    summary = data.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("text"), str):
        covers = summary.get("covers")
        entries = _entries(summary.get("facts"), created)
        covered = isinstance(covers, int) and 0 < covers <= len(created)
        if covered or entries:
            ConversationSummary.objects.create(
                conversation=conversation,
                text=summary["text"] if covered else "",
                upto_message_id=created[covers - 1].id if covered else 0,
                model=str(summary.get("model") or "") if covered else "",
                facts=entries,
            )
    return conversation


def _entries(raw, created: list[Message]) -> list[dict]:
    """Memory entries from an export, each naming its turn by place, as stored entries naming
    the imported message there."""
    entries = []
    for item in raw if isinstance(raw, list) else []:
        entry = memory_facts.Entry.from_dict(item) if isinstance(item, dict) else None
        if entry is None or not isinstance(entry.at, int):
            continue
        entry.at = created[entry.at].id if 0 <= entry.at < len(created) else 0
        entries.append(entry)
    return memory_facts.entries_to_json(entries)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _parse_time(value) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) and value else None
    except ValueError:
        return None
