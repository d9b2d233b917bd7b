"""The source page a citation links to."""

from __future__ import annotations

from django.urls import reverse

from apps.rag.models import Chunk, Document


def test_chunk_page_highlights_the_cited_passage(handbook, user, client_for):
    chunk = Chunk.objects.get(heading="Deploying the billing service > Rolling back")
    page = client_for(user).get(reverse("rag:chunk", args=[chunk.pk])).content.decode()
    assert "Deploying the billing service</h1>" in page
    highlighted = page.split('<div id="passage" class="passage">', 1)[1].split("</div>", 1)[0]
    assert "harbor rollback billing --to previous" in highlighted
    assert "Feature flags" not in highlighted  # the next section is outside the mark
    assert "Feature flags" in page  # but the whole document is shown


def test_document_text_is_escaped(make_corpus, user, client_for, tmp_path):
    (tmp_path / "xss.md").write_text(
        "# Tricky\n\n<script>alert('x')</script> <b>bold</b> and **strong**\n\n- one\n- two\n"
    )
    make_corpus("tricky", paths=[tmp_path / "xss.md"])
    document = Document.objects.get(title="Tricky")
    page = client_for(user).get(reverse("rag:document", args=[document.pk])).content.decode()
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in page
    assert "<script>alert" not in page and "<b>bold" not in page
    # The rest is Markdown, rendered: the document's own heading, emphasis and list.
    assert "<h1>Tricky</h1>" in page and "<strong>strong</strong>" in page
    assert "<li>one</li>" in page
