"""`manage.py ingest` and `reindex`: idempotent, replacing changed files, reporting bad input
without stopping, never leaving a half-written document."""

from __future__ import annotations

import shutil
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.rag import ingestion
from apps.rag.models import Chunk, Corpus, Document
from tests.rag.conftest import FIXTURES


def ingest(*args: str) -> str:
    out = StringIO()
    call_command("ingest", *args, "--no-progress", stdout=out)
    return out.getvalue()


@pytest.fixture
def folder(tmp_path):
    target = tmp_path / "handbook"
    shutil.copytree(FIXTURES / "handbook", target)
    return target


def test_ingest_is_idempotent_and_replaces_changed_files(db, embedding_model, folder):
    first = ingest("handbook", str(folder), "--access", "everyone")
    assert "created corpus handbook (usable by everyone signed in)" in first
    assert "handbook: 5 added, 0 replaced, 0 unchanged, 0 failed" in first
    corpus = Corpus.objects.get(name="handbook")
    chunk_ids = set(Chunk.objects.values_list("id", flat=True))
    assert corpus.document_count == 5 and corpus.chunk_count == len(chunk_ids) > 5

    second = ingest("handbook", str(folder))
    assert "0 added, 0 replaced, 5 unchanged, 0 failed; 0 chunks" in second
    assert set(Chunk.objects.values_list("id", flat=True)) == chunk_ids  # nothing rewritten

    (folder / "coffee.md").write_text("# The office coffee machine\n\nNow it is a tea machine.\n")
    third = ingest("handbook", str(folder))
    assert "0 added, 1 replaced, 4 unchanged" in third
    coffee = Document.objects.get(source__endswith="coffee.md")
    assert [c.text for c in coffee.chunks.all()] == [
        "# The office coffee machine\n\nNow it is a tea machine."
    ]
    assert Document.objects.count() == 5  # replaced, not duplicated
    corpus.refresh_from_db()
    assert corpus.last_ingest["replaced"] == 1


def test_globs_and_missing_paths(db, embedding_model, folder):
    out = ingest("handbook", str(folder / "*.md"), str(folder / "nope.txt"), str(folder / "*.x"))
    assert "3 added" in out
    assert f"FAILED {folder / 'nope.txt'}: no such file or directory" in out
    assert f"FAILED {folder / '*.x'}: no file matches this pattern" in out


def test_bad_files_are_reported_and_never_stop_the_rest(db, embedding_model, tmp_path):
    from tests.rag.test_extraction import blank_pdf

    (tmp_path / "good.md").write_text("# Good\n\nThe only readable file here.\n")
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02\x03" * 100)
    (tmp_path / "scan.pdf").write_bytes(blank_pdf())
    out = ingest("mixed", str(tmp_path), str(tmp_path / "missing.md"))
    assert "1 added, 0 replaced, 0 unchanged, 4 failed" in out
    for reason in ("empty file", "binary file", "PDF without text", "no such file"):
        assert reason in out
    assert list(Document.objects.values_list("title", flat=True)) == ["Good"]


def test_nothing_ingestible_is_an_error(db, embedding_model, tmp_path):
    with pytest.raises(CommandError, match="nothing could be ingested"):
        ingest("handbook", str(tmp_path / "nothing-here"))


def test_a_failed_write_leaves_the_old_version_whole(db, embedding_model, folder, monkeypatch):
    ingest("handbook", str(folder))
    old = {d.source: list(d.chunks.values_list("text", flat=True)) for d in Document.objects.all()}
    (folder / "deploy.md").write_text("# Deploying\n\nEverything changed.\n")
    (folder / "birds.txt").write_text("The club now meets on Saturdays.\n")

    real = ingestion.chunks_write

    def failing(*, document, chunks, vectors, **options):
        if document.source.endswith("deploy.md"):
            raise RuntimeError("disk full")
        return real(document=document, chunks=chunks, vectors=vectors, **options)

    monkeypatch.setattr(ingestion, "chunks_write", failing)
    out = ingest("handbook", str(folder))
    assert "1 replaced, 3 unchanged, 1 failed" in out
    assert "deploy.md: not stored (disk full)" in out
    deploy = Document.objects.get(source__endswith="deploy.md")
    assert deploy.title == "Deploying the billing service"  # the old document, untouched
    assert list(deploy.chunks.values_list("text", flat=True)) == old[deploy.source]
    birds = Document.objects.get(source__endswith="birds.txt")
    assert list(birds.chunks.values_list("text", flat=True)) == ["The club now meets on Saturdays."]


def test_reindex_rechunks_stored_text_without_the_files(db, embedding_model, folder, settings):
    ingest("handbook", str(folder))
    shutil.rmtree(folder)
    before = Chunk.objects.count()
    settings.RAG_CHUNK_TOKENS = 16
    settings.RAG_CHUNK_OVERLAP = 4
    out = StringIO()
    call_command("reindex", "handbook", "--no-progress", stdout=out)
    assert "5 replaced" in out.getvalue()
    assert Chunk.objects.count() > before
    assert set(Document.objects.values_list("pipeline", flat=True)) == {
        ingestion.pipeline_signature(size=16, overlap=4)
    }
    with pytest.raises(CommandError, match="no such corpus: nope"):
        call_command("reindex", "nope", stdout=StringIO())


def test_rag_eval_prints_recall_and_mrr(handbook):
    out = StringIO()
    call_command("rag_eval", "handbook", str(FIXTURES / "questions.jsonl"), "--k", "3", stdout=out)
    expected = "rag_eval: recall@3 1.000, MRR 1.000 over 5 questions (handbook)"
    assert out.getvalue().strip() == expected
