"""The ingestion pipeline: files → extracted text → chunks → embeddings → one transaction per
document. Used by `manage.py ingest`, `manage.py reindex` and the admin's upload and reindex.

Idempotent: a document whose source bytes (SHA-256) and pipeline (model, chunk size, overlap)
are unchanged is skipped; a changed one is replaced whole. Embedding, the slow part, happens
before the transaction, batched across documents; a document's old chunks are deleted and its
new ones inserted in one transaction, so a reader sees the old version or the new, never half.
Each file's failure is a line in the report and never stops the rest.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.rag import chunking
from apps.rag.chunk_writes import (  # noqa: F401  (bench/rag.py imports them from here)
    chunks_write,
    corpus_refresh_counts,
    index_ensure_logged,
    vector_literal,
)
from apps.rag.embeddings import MODEL_NAME, embed_texts
from apps.rag.extraction import SUPPORTED, Extracted, ExtractionError, extract
from apps.rag.models import Chunk, Corpus, Document

logger = logging.getLogger(__name__)

GLOB_CHARS = set("*?[")


@dataclass
class IngestReport:
    corpus: str
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    chunks: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    @property
    def documents(self) -> int:
        return self.added + self.replaced + self.unchanged

    def lines(self) -> list[str]:
        rate = (
            f" ({self.chunks / self.seconds:.0f} chunks/s)" if self.chunks and self.seconds else ""
        )
        out = [
            f"{self.corpus}: {self.added} added, {self.replaced} replaced, {self.unchanged} "
            f"unchanged, {len(self.failed)} failed; {self.chunks} chunks embedded in "
            f"{self.seconds:.1f}s{rate}"
        ]
        out += [f"  FAILED {source}: {reason}" for source, reason in self.failed]
        out += [f"  warning {source}: {reason}" for source, reason in self.warnings]
        return out

    def as_json(self) -> dict:
        return {
            "at": timezone.now().isoformat(),
            "added": self.added,
            "replaced": self.replaced,
            "unchanged": self.unchanged,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 2),
            "failed": [f"{s}: {r}" for s, r in self.failed[:50]],
        }


def pipeline_signature(*, size: int, overlap: int, model: str = MODEL_NAME) -> str:
    # CHUNKING_VERSION: a change of how text is cut makes the next ingest re-chunk every file.
    return f"{model}/{size}/{overlap}/{chunking.CHUNKING_VERSION}"


def expand_paths(paths: list[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Files named by paths, globs (`**` recursive) and folders; the rest as (arg, reason)."""
    found: dict[Path, None] = {}
    missing: list[tuple[str, str]] = []
    for arg in paths:
        if GLOB_CHARS & set(arg):
            matches = sorted(Path(p) for p in glob.glob(arg, recursive=True))
            files = [p for p in matches if p.is_file()]
            if not files:
                missing.append((arg, "no file matches this pattern"))
            found.update(dict.fromkeys(files))
        elif os.path.isdir(arg):
            files = sorted(
                p
                for p in Path(arg).rglob("*")
                if p.is_file()
                and p.suffix.lower() in SUPPORTED
                and not any(part.startswith(".") for part in p.relative_to(arg).parts)
            )
            if not files:
                missing.append((arg, f"folder holds no {'/'.join(SUPPORTED)} file"))
            found.update(dict.fromkeys(files))
        elif os.path.exists(arg):
            found[Path(arg)] = None
        else:
            missing.append((arg, "no such file or directory"))
    return list(found), missing


def source_name(path: Path) -> str:
    """Relative to the working directory when inside it, so `ingest docs docs/` run from the
    repository gives the same names on every machine."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


@dataclass
class _Pending:
    item: Extracted
    existing: Document | None
    chunks: list[chunking.Chunk]


class Ingestor:
    """Collects documents, embeds their chunks in batches, writes each in its own transaction."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        size: int | None = None,
        overlap: int | None = None,
        batch_size: int | None = None,
        force: bool = False,
        progress: bool = False,
        on_embedded: Callable[[int, int], None] | None = None,
    ) -> None:
        """`on_embedded(done, total)`: called as each batch of a flush's chunks is embedded
        (the slow part), for progress shown outside a terminal."""
        self.corpus = corpus
        self.size = size or settings.RAG_CHUNK_TOKENS
        self.overlap = settings.RAG_CHUNK_OVERLAP if overlap is None else overlap
        chunking.validate(self.size, self.overlap)
        self.batch_size = batch_size or settings.RAG_EMBED_BATCH
        self.model = corpus.embedding_model
        self.pipeline = pipeline_signature(size=self.size, overlap=self.overlap, model=self.model)
        self.force = force
        self.progress = progress
        self.report = IngestReport(corpus=corpus.name)
        self._pending: list[_Pending] = []
        self._bar = None
        self._on_embedded = on_embedded

    # Entry points -------------------------------------------------------------------------

    def add_paths(self, paths: list[str]) -> None:
        files, missing = expand_paths(paths)
        self.report.failed.extend(missing)
        from tqdm import tqdm

        self._bar = tqdm(
            total=len(files),
            unit="file",
            disable=not self.progress,
            file=sys.stderr,
            desc=f"ingest {self.corpus.name}",
            dynamic_ncols=True,
        )
        for path in files:
            source = source_name(path)
            try:
                data = path.read_bytes()
            except OSError as error:
                self.report.failed.append((source, f"unreadable ({error.strerror or error})"))
            else:
                self.add_bytes(source=source, data=data)
            self._bar.update(1)
            self._bar.set_postfix(chunks=self.report.chunks, refresh=False)

    def add_bytes(self, *, source: str, data: bytes) -> None:
        try:
            items, warnings = extract(source=source, data=data)
        except ExtractionError as error:
            self.report.failed.append((source, str(error)))
            return
        except Exception as error:  # a parser's own bug must not stop the other files
            logger.exception("extracting %s failed", source)
            self.report.failed.append((source, f"could not be read ({error.__class__.__name__})"))
            return
        self.report.warnings.extend((source, warning) for warning in warnings)
        for item in items:
            self.add_extracted(item)

    def add_extracted(self, item: Extracted) -> None:
        existing = Document.objects.filter(corpus=self.corpus, source=item.source).first()
        if (
            existing is not None
            and not self.force
            and existing.checksum == item.checksum
            and existing.pipeline == self.pipeline
            and existing.status == Document.Status.READY
        ):
            self.report.unchanged += 1
            return
        chunks = chunking.chunk_text(item.content, size=self.size, overlap=self.overlap)
        if not chunks:
            self.report.failed.append((item.source, "no text the embedding model can read"))
            return
        self._pending.append(_Pending(item, existing, chunks))
        if sum(len(p.chunks) for p in self._pending) >= self.batch_size * 4:
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        inputs = [
            embedding_input(title=p.item.title, heading=c.heading, text=c.text)
            for p in pending
            for c in p.chunks
        ]
        vectors = self._embed(inputs)
        offset = 0
        for p in pending:
            count = len(p.chunks)
            try:
                self._write(p, vectors[offset : offset + count])
            except Exception as error:
                logger.exception("writing %s failed", p.item.source)
                self.report.failed.append((p.item.source, f"not stored ({error})"))
            else:
                self.report.chunks += count
                if p.existing is None:
                    self.report.added += 1
                else:
                    self.report.replaced += 1
            offset += count

    def _embed(self, inputs: list[str], model: str | None = None):
        model = model or self.model
        if self._on_embedded is None:
            return embed_texts(inputs, model=model, purpose="bulk", batch_size=self.batch_size)
        parts = []
        for start in range(0, len(inputs), self.batch_size):
            batch = inputs[start : start + self.batch_size]
            parts.append(
                embed_texts(batch, model=model, purpose="bulk", batch_size=self.batch_size)
            )
            self._on_embedded(min(start + self.batch_size, len(inputs)), len(inputs))
        return np.concatenate(parts) if parts else embed_texts([], model=model)

    def finish(self) -> IngestReport:
        self.flush()
        if self._bar is not None:
            self._bar.close()
        self.report.seconds = time.monotonic() - self.report.started
        corpus_refresh_counts(corpus_id=self.corpus.pk, last_ingest=self.report.as_json())
        if self.report.chunks:
            index_ensure_logged(corpus_id=self.corpus.pk)
        return self.report

    # Writing ------------------------------------------------------------------------------

    @transaction.atomic
    def _write(self, pending: _Pending, vectors) -> None:
        item = pending.item
        # The corpus row, locked first: a model change's swap (apps/rag/reembedding.py) takes
        # the same lock, so these vectors land in the column the corpus reads, from its model.
        corpus = Corpus.objects.select_for_update().get(pk=self.corpus.pk)
        if corpus.embedding_model != self.model:  # swapped since these were embedded
            inputs = [
                embedding_input(title=item.title, heading=c.heading, text=c.text)
                for c in pending.chunks
            ]
            vectors = self._embed(inputs, model=corpus.embedding_model)
        width = int(np.asarray(vectors).shape[1])
        if width != corpus.embedding_dimensions:
            if Chunk.objects.filter(corpus_id=corpus.pk).exists():
                raise ValueError(
                    f"{corpus.embedding_model} gave {width} dimensions; the corpus holds "
                    f"{corpus.embedding_dimensions}"
                )
            # The corpus's first passages: its model's vectors set its dimension.
            Corpus.objects.filter(pk=corpus.pk).update(embedding_dimensions=width)
        document = (
            Document.objects.select_for_update()
            .filter(corpus=self.corpus, source=item.source)
            .first()
        ) or Document(corpus=self.corpus, source=item.source)
        document.title = item.title[:300]
        document.kind = item.kind
        document.content = item.content
        document.metadata = item.metadata
        document.checksum = item.checksum
        document.pipeline = pipeline_signature(
            size=self.size, overlap=self.overlap, model=corpus.embedding_model
        )
        document.status = Document.Status.READY
        document.error = ""
        document.chunk_count = len(pending.chunks)
        document.save()
        Chunk.objects.filter(document=document).delete()
        chunks_write(
            document=document, chunks=pending.chunks, vectors=vectors, slot=corpus.embedding_slot
        )
        Corpus.objects.filter(pk=self.corpus.pk).update(version=F("version") + 1)


def embedding_input(*, title: str, heading: str, text: str) -> str:
    """What the model embeds: the chunk under its title and section, so a passage that never
    repeats its subject ("It restarts the worker") still lands near questions about it."""
    if heading.startswith(title):
        context = heading
    else:
        context = chunking.HEADING_SEPARATOR.join(x for x in (title, heading) if x)
    return f"{context[:200]}\n{text}" if context else text


def extracted_from(document: Document) -> Extracted:
    """A stored document as the pipeline's input: reindex needs no source file."""
    return Extracted(
        source=document.source,
        title=document.title,
        kind=document.kind,
        content=document.content,
        checksum=document.checksum,
        metadata=document.metadata,
    )
