"""Corpus admin: counts and ingestion status, upload / reindex / delete, and "try a query"."""

from __future__ import annotations

import time

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from apps.accounts import read_gate
from apps.rag import caches, retrieval
from apps.rag.fleet import EmbeddingUnavailable
from apps.rag.forms import EmbeddingModelForm, TryQueryForm, UploadForm
from apps.rag.models import Chunk, Corpus, Document, Reembedding, UserFile
from apps.rag.reembedding import ReembedBusy, corpus_model_change, reembed_retry
from apps.rag.selectors import corpora_for_user
from apps.rag.services import (
    corpus_bump_version,
    corpus_ingest_uploads,
    corpus_reindex,
    document_delete,
    documents_reindex,
)
from apps.rag.user_files import user_file_delete


class _DeletesChunks:
    """Deleting a corpus or document deletes its chunks, which no one may delete alone."""

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(Chunk._meta.verbose_name)
        return deleted, counts, perms_needed, protected


def _report(request, report) -> None:
    level = messages.WARNING if report.failed else messages.SUCCESS
    for line in report.lines():
        messages.add_message(request, level, line)


@admin.register(Corpus)
class CorpusAdmin(_DeletesChunks, admin.ModelAdmin):
    list_display = (
        "name",
        "title",
        "access",
        "is_active",
        "document_count",
        "chunk_count",
        "ingestion_status",
        "retrieval_model",
        "fusion",
        "version",
        "updated",
    )
    list_filter = ("access", "is_active", "fusion")
    search_fields = ("name", "title", "description")
    filter_horizontal = ("groups",)
    readonly_fields = (
        "version",
        "document_count",
        "chunk_count",
        "ingestion_status",
        "tools",
        "retrieval_model",
    )
    fieldsets = (
        (None, {"fields": ("name", "title", "description", "is_active", "tools")}),
        ("Who may use it", {"fields": ("access", "groups", "plans")}),
        (
            "Ranking",
            {
                "fields": (
                    "fusion",
                    "vector_weight",
                    "text_weight",
                    "metadata_weight",
                    "relevance_floor",
                    "rerank_model",
                ),
                "description": "Weighted: score = vector weight * cosine similarity + text "
                "weight * full-text rank (relative to the best) + metadata weight * "
                "title/metadata match. RRF: the same weights over 1/(60 + rank) in each list.",
            },
        ),
        ("Embedding", {"fields": ("retrieval_model",)}),
        ("Status", {"fields": ("document_count", "chunk_count", "version", "ingestion_status")}),
    )
    actions = ["reindex_selected"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(owner__isnull=True)  # users' own: theirs

    @admin.display(description="last ingestion")
    def ingestion_status(self, corpus: Corpus) -> str:
        last = corpus.last_ingest or {}
        if not last:
            return "never"
        failed = len(last.get("failed", []))
        return (
            f"{last.get('at', '')[:16].replace('T', ' ')}: +{last.get('added', 0)} "
            f"~{last.get('replaced', 0)} ={last.get('unchanged', 0)}"
            + (f", {failed} failed" if failed else "")
        )

    @admin.display(description="embedding model")
    def retrieval_model(self, corpus: Corpus):
        if not corpus.pk:
            return corpus.embedding_model
        job = corpus.reembeddings.first()
        moving = job.progress if job and job.state != Reembedding.State.DONE else ""
        return format_html(
            '{} ({} dimensions){} · <a href="{}">change</a>',
            corpus.embedding_model,
            corpus.embedding_dimensions,
            f" — {moving}" if moving else "",
            reverse("admin:rag_corpus_model", args=[corpus.pk]),
        )

    @admin.display(description="tools")
    def tools(self, corpus: Corpus):
        if not corpus.pk:
            return "Save the corpus first."
        return format_html(
            '<a href="{}">Upload documents</a> · <a href="{}?corpora={}">Try a query</a> · '
            '<a href="{}?corpus__id__exact={}">Documents</a>',
            reverse("admin:rag_corpus_upload", args=[corpus.pk]),
            reverse("admin:rag_corpus_try"),
            corpus.pk,
            reverse("admin:rag_document_changelist"),
            corpus.pk,
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            corpus_bump_version(corpus=obj)  # weights may have changed: cached results are stale

    def get_urls(self):
        own = [
            path("try/", self.admin_site.admin_view(self.try_query), name="rag_corpus_try"),
            path(
                "<int:corpus_id>/model/",
                self.admin_site.admin_view(self.change_model),
                name="rag_corpus_model",
            ),
            path(
                "<int:corpus_id>/upload/",
                self.admin_site.admin_view(self.upload),
                name="rag_corpus_upload",
            ),
        ]
        return own + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "try_url": reverse("admin:rag_corpus_try")}
        return super().changelist_view(request, extra_context)

    @admin.action(description="Re-chunk and re-embed the selected corpora")
    def reindex_selected(self, request, queryset):
        if not request.user.has_perm("rag.change_corpus"):
            raise PermissionDenied
        for corpus in queryset:
            _report(request, corpus_reindex(corpus=corpus))

    def change_model(self, request, corpus_id: int):
        if not self.has_change_permission(request):
            raise PermissionDenied
        corpus = get_object_or_404(Corpus, pk=corpus_id)
        job = corpus.reembeddings.first()
        form = EmbeddingModelForm(request.POST or None, initial={"model": corpus.embedding_model})
        if request.method == "POST" and form.is_valid():
            try:
                if (
                    job
                    and job.state == Reembedding.State.FAILED
                    and job.model == form.cleaned_data["model"].strip()
                ):
                    reembed_retry(job=job)
                    messages.info(request, f"Re-embedding with {job.model} starts again.")
                elif corpus_model_change(corpus=corpus, model=form.cleaned_data["model"]):
                    messages.info(request, "Re-embedding in the background: progress below.")
                else:
                    messages.success(request, f"{corpus} uses {corpus.embedding_model} now.")
                return redirect("admin:rag_corpus_change", corpus.pk)
            except (ReembedBusy, EmbeddingUnavailable) as exc:
                form.add_error("model", str(exc))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "corpus": corpus,
            "job": job,
            "form": form,
            "title": f"Embedding model of {corpus}",
        }
        return TemplateResponse(request, "admin/rag/model.html", context)

    def upload(self, request, corpus_id: int):
        if not self.has_change_permission(request):
            raise PermissionDenied
        corpus = get_object_or_404(Corpus, pk=corpus_id)
        form = UploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            report = corpus_ingest_uploads(corpus=corpus, files=form.cleaned_data["files"])
            _report(request, report)
            return redirect("admin:rag_corpus_change", corpus.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "corpus": corpus,
            "form": form,
            "title": f"Upload documents to {corpus}",
        }
        return TemplateResponse(request, "admin/rag/upload.html", context)

    def try_query(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = TryQueryForm(request.GET or None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "form": form,
            "title": "Try a query",
        }
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            corpora = data["corpora"] or Corpus.objects.filter(is_active=True, owner__isnull=True)
            if data["as_user"] is not None:
                corpora = corpora.filter(pk__in=corpora_for_user(user=data["as_user"]))
            corpora = list(corpora)
            weights = None
            if data["vector_weight"] is not None:
                weights = retrieval.Weights(
                    data["vector_weight"], data["text_weight"], data["metadata_weight"]
                )
            started = time.perf_counter()
            embedding = caches.query_embeddings(data["query"], corpora)
            embedded = time.perf_counter()
            passages = retrieval.search(
                corpora=corpora,
                query=data["query"],
                embedding=embedding,
                k=data["k"],
                metadata_filter=data["metadata_filter"],
                boost=data["boost"],
                fusion=data["fusion"] or None,
                weights=weights,
                min_similarity=-1.0,  # show the whole ranking, including what the prompt drops
            )
            done = time.perf_counter()
            context.update(
                passages=passages,
                searched=corpora,
                embed_ms=(embedded - started) * 1000,
                search_ms=(done - embedded) * 1000,
            )
        return TemplateResponse(request, "admin/rag/try_query.html", context)


@admin.register(Document)
class DocumentAdmin(_DeletesChunks, admin.ModelAdmin):
    list_display = ("title", "corpus", "kind", "status", "chunk_count", "source", "updated")
    list_filter = ("corpus", "kind", "status")
    search_fields = ("title", "source")
    list_select_related = ("corpus",)
    readonly_fields = (
        "corpus",
        "source",
        "kind",
        "checksum",
        "pipeline",
        "status",
        "error",
        "chunk_count",
        "created",
        "updated",
        "view",
    )
    fields = ("title", "view", *readonly_fields[:-1], "metadata", "content")
    actions = ["reindex_selected", "delete_selected"]

    def get_queryset(self, request):
        # Users' own files are read by their owner only, staff included.
        return super().get_queryset(request).filter(corpus__owner__isnull=True)

    @admin.display(description="as users see it")
    def view(self, document: Document):
        return format_html('<a href="{}">open</a>', document.get_absolute_url())

    def has_add_permission(self, request) -> bool:
        return False  # documents come from ingestion or the corpus's upload page

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and form.changed_data:
            # Title, metadata or content edited: re-chunk so search sees the edit.
            _report(request, documents_reindex(documents=[obj]))

    def delete_model(self, request, obj):
        document_delete(document=obj)

    def delete_queryset(self, request, queryset):
        for document in queryset.select_related("corpus"):
            document_delete(document=document)

    @admin.action(description="Re-chunk and re-embed the selected documents")
    def reindex_selected(self, request, queryset):
        if not request.user.has_perm("rag.change_document"):
            raise PermissionDenied
        _report(request, documents_reindex(documents=queryset.select_related("corpus")))


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = ("__str__", "corpus", "heading", "token_count")
    list_filter = ("corpus",)
    search_fields = ("text", "heading", "document__title")
    list_select_related = ("document", "corpus")
    exclude = ("embedding", "embedding_alt", "search")
    readonly_fields = (
        "corpus",
        "document",
        "ordinal",
        "heading",
        "text",
        "token_count",
        "char_start",
        "char_end",
        "metadata",
    )

    def get_queryset(self, request):
        return super().get_queryset(request).filter(corpus__owner__isnull=True)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # chunks follow their document: edit or reindex the document

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(UserFile)
class UserFileAdmin(admin.ModelAdmin):
    """Users' own files, for operators: who attached what and whether it could be read. Never
    their text (only the owner reads that), and nothing to change here."""

    list_display = ("name", "owner", "status", "size", "chunks_total", "created")
    list_filter = ("status",)
    search_fields = ("name", "owner__username")
    list_select_related = ("owner",)
    fields = ("name", "owner", "status", "error", "size", "chunks_total", "created", "updated")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data")

    # A file's name can say as much as its text: shown to staff who may read other people's
    # conversations only (apps/accounts/read_gate.py).
    def get_list_display(self, request):
        shown = super().get_list_display(request)
        return shown if read_gate.may_read_others(request.user) else ("id", *shown[1:])

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if read_gate.may_read_others(request.user):
            return fields
        return [field for field in fields if field != "name"]

    def get_search_fields(self, request):
        return (
            self.search_fields if read_gate.may_read_others(request.user) else ("owner__username",)
        )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def delete_model(self, request, obj):
        user_file_delete(entry=obj)  # with its document, chunks and embeddings

    def delete_queryset(self, request, queryset):
        for entry in queryset:
            user_file_delete(entry=entry)
