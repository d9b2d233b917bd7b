"""A user's own files: ingested into their private corpus by the real pipeline (with progress),
searched for them and nobody else (in the search's SQL), deleted with every passage, and
rejected with a clear reason when they cannot be used."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.urls import reverse

from apps.rag.models import Chunk, Corpus, Document, UserFile
from apps.rag.selectors import corpora_for_user, searchable_corpora_for_user
from apps.rag.services import retrieve_for_prompt
from apps.rag.user_files import (
    FileRejected,
    user_file_accept,
    user_file_claim_next,
    user_file_delete,
    user_files_ingest_pending,
)
from tests.rag.test_extraction import pdf_with_text

NOTES = b"""# Greenhouse notes

The greenhouse irrigation valve code is VALVE-7731. Open it for exactly nine minutes
every morning; longer floods the tomato beds.
"""
QUERY = "what is the greenhouse irrigation valve code"


@pytest.fixture
def ingested(embedding_model):
    def ingest(owner, name="notes.md", data=NOTES) -> UserFile:
        entry, created = user_file_accept(owner=owner, name=name, data=data)
        assert created
        assert user_files_ingest_pending() == 1
        entry.refresh_from_db()
        return entry

    return ingest


def _chunk_rows(document_id: int) -> int:
    # Embeddings and full-text vectors live on the chunk rows: none left means none searchable.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM rag_chunk WHERE document_id = %s", [document_id])
        return cursor.fetchone()[0]


def test_a_file_is_ingested_into_the_owners_private_corpus(user, ingested):
    entry = ingested(user)
    assert entry.status == UserFile.Status.READY, entry.error
    assert entry.data == b""  # the document holds the text now
    corpus = entry.corpus
    assert corpus.owner == user and corpus.access == Corpus.Access.PRIVATE
    assert entry.document.corpus == corpus and "VALVE-7731" in entry.document.content
    assert entry.chunks_total == entry.chunks_done == entry.document.chunk_count > 0
    assert Chunk.objects.filter(document=entry.document).count() == entry.chunks_total


def test_progress_is_written_while_the_file_is_embedded(
    user, embedding_model, settings, monkeypatch
):
    settings.RAG_EMBED_BATCH = 2
    settings.RAG_CHUNK_TOKENS = 40
    settings.RAG_CHUNK_OVERLAP = 0
    text = "\n\n".join(
        f"Paragraph {i} speaks of canal lock number {i} and its keeper." * 3 for i in range(12)
    ).encode()
    entry, _ = user_file_accept(owner=user, name="locks.txt", data=text)
    seen = []
    from apps.rag import user_files

    original = user_files._report_progress

    def watch(entry_id, done, total):
        original(entry_id, done, total)
        row = UserFile.objects.get(pk=entry_id)
        seen.append((row.status, row.chunks_done, row.chunks_total))

    monkeypatch.setattr(user_files, "_report_progress", watch)
    user_files_ingest_pending()
    assert len(seen) > 2
    assert all(status == UserFile.Status.INGESTING for status, _, _ in seen)
    assert [done for _, done, _ in seen] == sorted(done for _, done, _ in seen)
    assert seen[-1][1] == seen[-1][2]
    entry.refresh_from_db()
    assert entry.status == UserFile.Status.READY


def test_search_finds_my_file_and_not_another_users(user, other_user, ingested):
    mine = ingested(user)
    passages = retrieve_for_prompt(user=user, query=QUERY)
    assert passages and passages[0].document_id == mine.document_id
    assert passages[0].source_url == reverse("rag:chunk", args=[passages[0].chunk_id])

    # The other user asks the same question (same cache): nothing of mine comes back, and
    # naming my corpus explicitly does not help.
    assert retrieve_for_prompt(user=other_user, query=QUERY) == []
    assert retrieve_for_prompt(user=other_user, query=QUERY, corpora=[mine.corpus_id]) == []
    assert mine.corpus_id not in {c.pk for c in searchable_corpora_for_user(user=other_user)}
    assert not corpora_for_user(user=other_user).filter(pk=mine.corpus_id).exists()

    # Their own file is theirs alone in turn.
    theirs = ingested(other_user, name="theirs.md", data=NOTES.replace(b"7731", b"0042"))
    found = retrieve_for_prompt(user=other_user, query=QUERY, k=10)
    assert {p.corpus_id for p in found} == {theirs.corpus_id}
    assert theirs.corpus_id not in {
        p.corpus_id for p in retrieve_for_prompt(user=user, query=QUERY, k=10)
    }


def test_a_private_corpus_stays_private_whatever_its_groups_plans_or_access_say(
    user, other_user, ingested
):
    mine = ingested(user)
    readers = Group.objects.create(name="readers")
    other_user.groups.add(readers)
    mine.corpus.groups.add(readers)
    Corpus.objects.filter(pk=mine.corpus_id).update(plans=["free", "default"])
    assert mine.corpus_id not in {c.pk for c in searchable_corpora_for_user(user=other_user)}
    assert not corpora_for_user(user=other_user).filter(pk=mine.corpus_id).exists()
    assert retrieve_for_prompt(user=other_user, query=QUERY) == []


def test_source_pages_of_my_file_404_for_everyone_else_staff_included(
    user, other_user, ingested, client_for
):
    mine = ingested(user)
    chunk = Chunk.objects.filter(document=mine.document).first()
    urls = [reverse("rag:chunk", args=[chunk.pk]), reverse("rag:document", args=[mine.document_id])]
    for url in urls:
        page = client_for(user).get(url)
        assert page.status_code == 200 and "VALVE-7731" in page.content.decode()
    other_user.is_staff = other_user.is_superuser = True
    other_user.save()
    for url in urls:
        assert client_for(other_user).get(url).status_code == 404


def test_delete_removes_the_document_its_chunks_and_vectors(user, ingested, client_for):
    entry = ingested(user)
    document_id = entry.document_id
    assert _chunk_rows(document_id) > 0 and retrieve_for_prompt(user=user, query=QUERY)
    user_file_delete(entry=entry)
    assert not UserFile.objects.filter(pk=entry.pk).exists()
    assert not Document.objects.filter(pk=document_id).exists()
    assert _chunk_rows(document_id) == 0
    corpus = Corpus.objects.get(pk=entry.corpus_id)
    assert corpus.chunk_count == 0 and corpus.document_count == 0
    # The version changed, so no cached result of the old content is read again.
    assert retrieve_for_prompt(user=user, query=QUERY) == []


def test_the_profile_page_lists_and_deletes_my_files_only(user, other_user, ingested, client_for):
    entry = ingested(user)
    page = client_for(user).get(reverse("accounts:profile")).content.decode()
    assert "notes.md" in page and reverse("rag:file_delete", args=[entry.pk]) in page
    assert (
        "notes.md" not in client_for(other_user).get(reverse("accounts:profile")).content.decode()
    )

    delete = reverse("rag:file_delete", args=[entry.pk])
    assert client_for(other_user).post(delete).status_code == 404
    assert UserFile.objects.filter(pk=entry.pk).exists()
    assert client_for(user).get(delete).status_code == 405
    response = client_for(user).post(delete)
    assert response.status_code == 302 and response["Location"] == reverse("accounts:profile")
    assert not UserFile.objects.filter(pk=entry.pk).exists()


def test_a_file_deleted_while_it_is_read_leaves_no_passages(user, embedding_model):
    entry, _ = user_file_accept(owner=user, name="notes.md", data=NOTES)
    claimed = user_file_claim_next()
    UserFile.objects.filter(pk=claimed.pk).delete()
    from apps.rag.user_files import user_file_ingest

    user_file_ingest(entry=claimed)
    assert not Document.objects.filter(corpus=entry.corpus).exists()
    assert retrieve_for_prompt(user=user, query=QUERY) == []


def test_a_pdf_is_read_page_by_page(user, ingested):
    entry = ingested(
        user, name="manual.pdf", data=pdf_with_text("Cover page", "The valve code is VALVE-7731.")
    )
    assert entry.status == UserFile.Status.READY, entry.error
    passages = retrieve_for_prompt(user=user, query="valve code VALVE-7731")
    assert passages and passages[0].metadata.get("page") == 2


@pytest.mark.parametrize(
    ("name", "data", "status", "words"),
    [
        ("report.docx", b"PK\x03\x04 word", 400, "PDF, Markdown, HTML or text"),
        ("noext", b"hello", 400, "PDF, Markdown, HTML or text"),
        ("empty.txt", b"  \n", 400, "empty"),
        ("fake.pdf", b"just text", 400, "not a PDF"),
        ("latin.txt", "café".encode("latin-1"), 400, "not UTF-8"),
        ("blob.md", b"\x00\x01\x02 binary", 400, "binary"),
        ("big.txt", b"a" * 2049, 413, "at most"),
    ],
)
def test_bad_files_are_rejected_with_a_reason_and_nothing_stored(
    user, settings, name, data, status, words
):
    settings.RAG_USER_FILE_MAX_BYTES = 2048
    with pytest.raises(FileRejected) as caught:
        user_file_accept(owner=user, name=name, data=data)
    assert caught.value.status == status and words in str(caught.value)
    assert not UserFile.objects.exists()


def test_quota_limits_and_a_failed_file_keeps_the_others(user, ingested, settings):
    good = ingested(user)
    bad = ingested(user, name="scan.pdf", data=b"%PDF-1.4 not really a pdf at all")
    assert bad.status == UserFile.Status.FAILED and "PDF" in bad.error and bad.data == b""
    good.refresh_from_db()
    assert good.status == UserFile.Status.READY and retrieve_for_prompt(user=user, query=QUERY)

    settings.RAG_USER_FILES_MAX = 1  # failed files do not count
    with pytest.raises(FileRejected, match="delete one") as caught:
        user_file_accept(owner=user, name="more.md", data=b"# More\nwords")
    assert caught.value.status == 400
    settings.RAG_USER_FILES_MAX = 50
    settings.RAG_USER_FILES_MAX_TOTAL_BYTES = good.size + 5
    with pytest.raises(FileRejected, match="delete some") as caught:
        user_file_accept(owner=user, name="more.md", data=b"# More\nwords")
    assert caught.value.status == 413


def test_the_same_bytes_twice_are_one_file(user, ingested):
    entry = ingested(user)
    again, created = user_file_accept(owner=user, name="copy.md", data=NOTES)
    assert not created and again.pk == entry.pk
    assert UserFile.objects.count() == 1


def test_an_ingestion_that_went_quiet_is_claimed_again(user, settings, embedding_model):
    entry, _ = user_file_accept(owner=user, name="notes.md", data=NOTES)
    assert user_file_claim_next().pk == entry.pk
    assert user_file_claim_next() is None  # being read: nobody else takes it
    settings.RAG_USER_FILE_STALE_SECONDS = 0
    assert user_file_claim_next().pk == entry.pk
    assert user_file_claim_next().pk == entry.pk  # the third reader
    # A file every reader went quiet on is given up, with a reason, not tried for ever.
    assert user_file_claim_next() is None
    entry.refresh_from_db()
    assert entry.status == UserFile.Status.FAILED and "3 times" in entry.error


def test_a_files_html_and_name_are_shown_as_text_never_run(user, ingested, client_for):
    hostile = (
        b"# Notes <img src=x onerror=alert(1)>\n\nValve VALVE-7731 <script>alert(2)</script>\n"
    )
    entry = ingested(user, name="<img src=y onerror=alert(3)>.md", data=hostile)
    assert entry.name == "<img src=y onerror=alert(3)>.md"
    assert entry.status == UserFile.Status.READY, entry.error
    client = client_for(user)
    chunk = Chunk.objects.filter(document=entry.document).first()
    for url in (reverse("rag:chunk", args=[chunk.pk]), reverse("accounts:profile")):
        page = client.get(url).content.decode()
        assert "<script>alert(2)" not in page and "<img src=x" not in page
        assert "<img src=y" not in page
    assert "&lt;img src=y onerror=alert(3)&gt;.md" in page  # the profile page names it
    assert "VALVE-7731" in client.get(reverse("rag:chunk", args=[chunk.pk])).content.decode()


def test_the_admin_lists_users_files_without_their_text_and_deletes_them_whole(
    user, other_user, ingested, client_for
):
    entry = ingested(user)
    other_user.is_staff = other_user.is_superuser = True
    other_user.save()
    admin = client_for(other_user)
    listing = admin.get(reverse("admin:rag_userfile_changelist")).content.decode()
    assert "notes.md" in listing
    detail = admin.get(reverse("admin:rag_userfile_change", args=[entry.pk])).content.decode()
    assert "VALVE-7731" not in detail
    # Nor do the corpus and document lists show the private corpus.
    documents = admin.get(reverse("admin:rag_document_changelist")).content.decode()
    assert "Greenhouse notes" not in documents
    assert admin.get(
        reverse("admin:rag_document_change", args=[entry.document_id])
    ).status_code in (302, 404)
    response = admin.post(reverse("admin:rag_userfile_delete", args=[entry.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not Document.objects.filter(pk=entry.document_id).exists()
    assert _chunk_rows(entry.document_id) == 0


def test_the_management_command_drains_the_queue(user, embedding_model):
    from io import StringIO

    from django.core.management import call_command

    entry, _ = user_file_accept(owner=user, name="notes.md", data=NOTES)
    out = StringIO()
    call_command("ingest_user_files", stdout=out)
    assert "1 file(s) ingested" in out.getvalue()
    entry.refresh_from_db()
    assert entry.status == UserFile.Status.READY
