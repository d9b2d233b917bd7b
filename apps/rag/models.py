"""Corpora the operator ingests, their documents, and the chunks retrieval searches.

A chunk carries its corpus id (denormalised from its document) so the ACL filter and the HNSW
search run on one table, and its document's metadata merged into its own so a metadata filter
is one `@>` on one column.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.contrib.auth.models import Group
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.urls import reverse
from pgvector.django import VectorField

from apps.rag.embeddings import DIMENSIONS, MODEL_NAME, default_model_name


def validate_reranker(value: str | None) -> None:
    """A corpus's reranker names one this web machine can use: "off", `fleet:NAME`, a folder
    (a CrossEncoder) or a .gguf file."""
    value = (value or "").strip()
    if not value or value == "off" or (value.startswith("fleet:") and value[6:].strip()):
        return
    if os.path.isdir(value) or (value.endswith(".gguf") and os.path.isfile(value)):
        return
    raise ValidationError(
        f"No reranker at {value!r} on this machine: a cross-encoder folder, a .gguf file, "
        "fleet:NAME or off."
    )


class Corpus(models.Model):
    class Access(models.TextChoices):
        EVERYONE = "everyone", "Everyone signed in"
        RESTRICTED = "restricted", "Only the chosen groups and plans"
        PRIVATE = "private", "Only its owner (a user's own files)"

    class Fusion(models.TextChoices):
        WEIGHTED = "weighted", "Weighted scores"
        RRF = "rrf", "Reciprocal rank fusion"

    name = models.SlugField(
        max_length=80, unique=True, help_text="Used on the command line: ingest <name> …"
    )
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True, help_text="Inactive corpora are never searched.")
    access = models.CharField(max_length=20, choices=Access.choices, default=Access.RESTRICTED)
    groups = models.ManyToManyField(
        Group, blank=True, related_name="corpora", help_text="With restricted access: these groups."
    )
    plans = ArrayField(
        models.CharField(max_length=64),
        blank=True,
        default=list,
        help_text="With restricted access: users on these plans (plan slugs, comma separated).",
    )
    # Tuned on bench/data/docs_questions.jsonl (its dev split): the full-text and heading
    # matches are tie-breakers; at 0.2 / 0.1 a shared word outranked the passage that answers.
    vector_weight = models.FloatField(default=0.7, validators=[MinValueValidator(0.0)])
    text_weight = models.FloatField(default=0.07, validators=[MinValueValidator(0.0)])
    metadata_weight = models.FloatField(default=0.03, validators=[MinValueValidator(0.0)])
    fusion = models.CharField(max_length=10, choices=Fusion.choices, default=Fusion.WEIGHTED)
    # The relevance gate: a passage is given to the model only when its cosine similarity to
    # the question reaches this. Set by `rag_eval --calibrate` from the corpus's own questions
    # and off-topic ones (similarities differ from corpus to corpus); empty: the
    # RAG_MIN_SIMILARITY default, where a full-text match also passes.
    relevance_floor = models.FloatField(
        null=True,
        blank=True,
        help_text="Least cosine similarity of a passage given to the model; set by "
        "`manage.py rag_eval <corpus> <questions> --calibrate`.",
    )
    # Its second stage (apps/rag/rerank.py), for this corpus's passages: a CrossEncoder folder,
    # `fleet:NAME` (a reranker on the workers), a GGUF, or "off"; empty: RAG_RERANK_MODEL.
    rerank_model = models.CharField(  # noqa: DJ001 (null: the service's default, not a name)
        max_length=300,
        null=True,
        blank=True,
        validators=[validate_reranker],
        help_text="Reorders this corpus's best passages: a cross-encoder folder, fleet:NAME "
        "(python -m worker embed --kind score), a .gguf file, or off. Empty: the service's "
        "RAG_RERANK_MODEL.",
    )
    # A user's own files: searched for that user only (selectors decide it in SQL), whatever
    # its groups or plans say.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        editable=False,
        on_delete=models.CASCADE,
        related_name="private_corpora",
    )
    # Its embedding model (apps/rag/embeddings.py says where it runs) and the length of its
    # vectors, which sit in the chunks' column `embedding_slot` names (apps/rag/vector_index.py).
    # Changing the model re-embeds into the other column; the swap is one update of these three.
    # The database defaults keep the previous release's inserts valid during an upgrade.
    embedding_model = models.CharField(
        max_length=200, default=default_model_name, db_default=MODEL_NAME, editable=False
    )
    embedding_dimensions = models.PositiveIntegerField(
        default=DIMENSIONS, db_default=DIMENSIONS, editable=False
    )
    embedding_slot = models.PositiveSmallIntegerField(default=0, db_default=0, editable=False)
    # Bumped by every change to the corpus's content or ranking: cached results of older
    # versions are never read again (they expire on their TTL).
    version = models.PositiveBigIntegerField(default=1, editable=False)
    document_count = models.PositiveIntegerField(default=0, editable=False)
    chunk_count = models.PositiveIntegerField(default=0, editable=False)
    last_ingest = models.JSONField(default=dict, blank=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "corpora"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(access="private", owner__isnull=False)
                | (~models.Q(access="private") & models.Q(owner__isnull=True)),
                name="rag_corpus_private_has_owner",
            ),
            models.UniqueConstraint(fields=["owner"], name="rag_corpus_one_private_per_user"),
        ]

    def __str__(self) -> str:
        return self.title or self.name

    def clean(self) -> None:
        if self.vector_weight + self.text_weight + self.metadata_weight <= 0:
            raise ValidationError("At least one retrieval weight must be above zero.")


class Document(models.Model):
    class Status(models.TextChoices):
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=300)
    # Where it came from: a path (relative to where `ingest` ran), an upload's name, or
    # `file.jsonl#<id>` for one record of a JSON Lines file. Unique per corpus: the identity
    # that makes re-ingesting the same file replace, not duplicate.
    source = models.CharField(max_length=1000)
    kind = models.CharField(max_length=10)
    content = models.TextField(help_text="The extracted text; reindex re-chunks it.")
    metadata = models.JSONField(default=dict, blank=True)
    checksum = models.CharField(max_length=64, help_text="SHA-256 of the source bytes.")
    # Chunking and embedding settings that produced the chunks: a change re-embeds.
    pipeline = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.READY)
    error = models.TextField(blank=True)
    chunk_count = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["corpus", "source"]
        constraints = [
            models.UniqueConstraint(fields=["corpus", "source"], name="rag_document_unique_source")
        ]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("rag:document", args=[self.pk])


class Chunk(models.Model):
    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="chunks")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    heading = models.CharField(
        max_length=500, blank=True, help_text="Section path, outermost first."
    )
    text = models.TextField()
    token_count = models.PositiveIntegerField()
    # Where the chunk lies in its document's content: the source view highlights it there.
    char_start = models.PositiveIntegerField()
    char_end = models.PositiveIntegerField()
    # Two columns of any dimension: the corpus's vectors are in the one its `embedding_slot`
    # names; the other is filled while a new model re-embeds the corpus. Each corpus has its own
    # HNSW index over its column cast to its dimension (apps/rag/vector_index.py).
    embedding = VectorField(null=True)
    embedding_alt = VectorField(null=True)
    # Title and heading weighted A, text B; written by the same statement that inserts the chunk
    # (services.chunks_write) with settings.RAG_TEXT_SEARCH_CONFIG.
    search = SearchVectorField(null=True)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["document", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["document", "ordinal"], name="rag_chunk_unique_ordinal")
        ]
        indexes = [
            # The vector indexes are per corpus and made by apps/rag/vector_index.py.
            # Without fastupdate's pending list, which every search scans until VACUUM merges
            # it (a few hundred pages after one ingest: milliseconds per query). Inserting into
            # the index directly costs ingestion little next to embedding.
            GinIndex(fields=["search"], name="rag_chunk_search_gin", fastupdate=False),
            GinIndex(
                fields=["metadata"], name="rag_chunk_metadata_gin", opclasses=["jsonb_path_ops"]
            ),
        ]

    def __str__(self) -> str:
        return f"{self.document} #{self.ordinal}"

    def get_absolute_url(self) -> str:
        return reverse("rag:chunk", args=[self.pk])


class UserFile(models.Model):
    """A file a user attached in the chat: waits here (with its bytes) until ingestion, off the
    request path, turns it into a Document of the user's private corpus. Its row is also the
    progress the page polls, and the entry the profile page lists and deletes."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Waiting"
        INGESTING = "ingesting", "Reading"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rag_files"
    )
    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="user_files")
    # Deleting the document (the admin may) takes the entry with it.
    document = models.OneToOneField(
        Document, null=True, blank=True, on_delete=models.CASCADE, related_name="user_file"
    )
    name = models.CharField(max_length=255)
    size = models.PositiveBigIntegerField()
    checksum = models.CharField(max_length=64, help_text="SHA-256 of the bytes.")
    # Kept only until ingestion ends: the document holds the extracted text from then on.
    data = models.BinaryField(editable=False)
    # Where it was attached (a chat id: rag knows nothing of chat's models).
    conversation_id = models.PositiveBigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True)
    chunks_done = models.PositiveIntegerField(default=0)
    chunks_total = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    # Times ingestion started on it: a file that kills or hangs every reader is given up.
    attempts = models.PositiveSmallIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["status", "created"], name="rag_userfile_status")]

    def __str__(self) -> str:
        # Not its name, which can say as much as its text: the admin shows this name on pages
        # open to staff who may not read other people's files.
        return f"File {self.pk}"


class Reembedding(models.Model):
    """A corpus moving to another embedding model: its passages are embedded into the free
    column while the old vectors keep serving, then the corpus switches in one update. The row
    is the progress the admin shows (apps/rag/reembedding.py)."""

    class State(models.TextChoices):
        QUEUED = "queued", "Waiting"
        RUNNING = "running", "Embedding"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    corpus = models.ForeignKey(Corpus, on_delete=models.CASCADE, related_name="reembeddings")
    model = models.CharField(max_length=200)
    previous_model = models.CharField(max_length=200, blank=True)
    dimensions = models.PositiveIntegerField(null=True, blank=True)
    slot = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["corpus"],
                condition=models.Q(state__in=["queued", "running"]),
                name="rag_reembedding_one_at_a_time",
            )
        ]

    def __str__(self) -> str:
        return f"{self.corpus} → {self.model}"

    @property
    def progress(self) -> str:
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        text = f"{self.get_state_display()}: {self.model}, {self.done}/{self.total} passages{share}"
        return f"{text}: {self.error}" if self.error else text
