from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    # No index of its own: the sidebar's index below leads with it (every question rewrites
    # the row, and so every index of it).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="conversations",
        db_index=False,
    )
    title = models.CharField(max_length=120, default="New chat")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    archived = models.BooleanField(default=False)
    # The model its answers come from, as workers announce it ("": the default model).
    model = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "archived", "-updated"])]
        # Staff status alone reads nobody's conversations: this permission does, with a reason
        # given for each read and recorded (apps/accounts/read_gate.py).
        permissions = [
            (
                "read_others_conversations",
                "Can read other people's conversations (giving a reason, recorded)",
            )
        ]

    def __str__(self) -> str:
        # Not the title (the first question's words): a name shown wherever Django lists
        # objects, such as the admin's delete confirmations, must not read anyone's chat.
        return f"Conversation {self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system", "System"
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Stopped"

    # No index of its own: the (conversation, created) index below leads with it.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
    # The request that produced this (assistant) message. Unique (Meta.constraints), so a
    # request delivered twice can never store two answers; NULL for questions, which have none.
    request_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # An answer that failed or was stopped is kept (with what text there was) so the user sees
    # what happened; only done turns go back into later prompts.
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DONE)
    error = models.CharField(max_length=300, blank=True)
    # Passages the answer cites: [{number, chunk_id, document_id, title, snippet, source_url}].
    citations = models.JSONField(default=list, blank=True)
    # The user asked to keep this turn in every prompt, however old it is.
    pinned = models.BooleanField(default=False, db_default=False)
    # Why the answer's text ended ("stop", "length", "loop"; "" before it was recorded), so a
    # page loaded later can still say that an answer was cut and offer to continue it.
    finish_reason = models.CharField(max_length=16, blank=True, default="", db_default="")

    class Meta:
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["conversation", "created"])]
        # A constraint rather than unique=True, which adds a second index for LIKE queries
        # on the column that nothing asks and every message pays for.
        constraints = [
            models.UniqueConstraint(fields=["request_id"], name="chat_message_one_per_request")
        ]

    def __str__(self) -> str:
        return f"{self.role} message {self.pk}"  # never its text (see Conversation.__str__)


class ConversationSummary(models.Model):
    """What a conversation remembers of turns that no longer fit the prompt: a rolling summary
    of every finished turn up to `upto_message_id`, rewritten incrementally (the previous
    summary plus the turns dropped since) by a background request."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="summary"
    )
    text = models.TextField()
    # The newest message the summary covers: older turns leave the prompt, the summary
    # speaks for them.
    upto_message_id = models.BigIntegerField()
    model = models.CharField(max_length=200, blank=True)  # the model that wrote it
    updated = models.DateTimeField(auto_now=True)
    # What the user told Sluice about themselves (and others), as of `upto_message_id`, with
    # the corrections and deletions they made on the page: memory_facts.Entry dicts. A row
    # with upto 0 and no text holds only such edits, before any summary was written.
    facts = models.JSONField(default=list, blank=True, db_default=[])

    def __str__(self) -> str:
        return f"summary of {self.conversation_id} up to {self.upto_message_id}"


class RetentionPolicy(models.Model):
    """How long conversations stay as they are (one row, edited in the admin; applied by
    `manage.py apply_retention`, run daily from cron or a scheduler)."""

    archive_after_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Archive conversations untouched for this many days. Empty: never.",
    )
    drop_detail_after_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="For archived conversations untouched this long, delete all but the latest "
        "turns (their summary stays). Empty: never.",
    )
    keep_turns = models.PositiveIntegerField(
        default=20, help_text="Messages kept when the detail of a cold conversation is dropped."
    )

    class Meta:
        verbose_name_plural = "retention policy"

    def __str__(self) -> str:
        return "Retention policy"

    @classmethod
    def current(cls) -> RetentionPolicy:
        return cls.objects.order_by("id").first() or cls()


class MemoryWriter(models.Model):
    """Whether one model writes the conversations' memory itself (memory_writer.py): after each
    answer, a background request asks it which of the user's words to keep. Off, the model-free
    reading keeps the user's statements (memory_facts.py). `accuracy` is what bench/memory.py
    --writer measured for the model, so the choice is made on a figure."""

    model = models.CharField(
        max_length=200,
        unique=True,
        blank=True,
        help_text="The model's name as its workers announce it (empty: the default model).",
    )
    writes_memory = models.BooleanField(default=False)
    accuracy = models.FloatField(
        null=True,
        blank=True,
        help_text="Facts kept in the frozen memory set with this model writing, 0 to 1 "
        "(bench/memory.py --writer); empty: not measured.",
    )
    stale_shown = models.PositiveIntegerField(
        null=True, blank=True, help_text="Old values shown as current in the same run."
    )
    measured_with = models.CharField(
        max_length=300, blank=True, help_text="The command and the tree the figures came from."
    )
    measured_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"memory writer {self.model or '(default model)'}"
