"""Extraction of each supported format, and a clear reason for each file that cannot be read."""

from __future__ import annotations

import json

import pytest
from pypdf import PdfWriter

from apps.rag.extraction import ExtractionError, extract


def pdf_with_text(*pages: str) -> bytes:
    """A minimal real PDF whose pages carry the given text in Helvetica."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        page_id, content_id = len(objects) + 1, len(objects) + 2
        kids.append(f"{page_id} 0 R")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R "
            "/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica "
            ">> >> >> >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out


def blank_pdf() -> bytes:
    import io

    writer = PdfWriter()
    writer.add_blank_page(width=612, height=792)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def test_markdown_title_and_text():
    [doc], warnings = extract(source="guide.md", data=b"# Install guide\n\nRun make run.\n")
    assert doc.title == "Install guide"
    assert doc.kind == "md"
    assert "Run make run." in doc.content
    assert warnings == []


def test_html_keeps_headings_drops_scripts_and_navigation():
    html = (
        b"<html><head><title>Badges</title><script>var x = 1;</script></head><body>"
        b"<nav>Home</nav><h1>Badges</h1><p>Wear it &amp; show it.</p><h2>Lost</h2><p>Report.</p>"
        b"</body></html>"
    )
    [doc], _ = extract(source="badges.html", data=html)
    assert doc.title == "Badges"
    assert "# Badges" in doc.content and "## Lost" in doc.content
    assert "Wear it & show it." in doc.content
    assert "var x" not in doc.content and "Home" not in doc.content


def test_pdf_pages_are_separated_by_page_breaks():
    [doc], _ = extract(source="report.pdf", data=pdf_with_text("First page words", "Second one"))
    assert doc.kind == "pdf"
    assert doc.content.split("\f") == ["First page words", "Second one"]


def test_jsonl_is_one_document_per_line_and_bad_lines_are_reported():
    lines = [
        json.dumps({"id": "a1", "title": "Alpha", "text": "Alpha text.", "metadata": {"x": 1}}),
        "{not json",
        json.dumps({"title": "No text"}),
        json.dumps({"url": "https://example.org/b", "text": "Beta text."}),
    ]
    docs, warnings = extract(source="faq.jsonl", data="\n".join(lines).encode())
    assert [d.source for d in docs] == ["faq.jsonl#a1", "faq.jsonl#https://example.org/b"]
    assert docs[0].metadata == {"x": 1}
    assert docs[1].metadata == {"url": "https://example.org/b"}
    assert len(warnings) == 2 and "line 2" in warnings[0] and "line 3" in warnings[1]


@pytest.mark.parametrize(
    ("source", "data", "reason"),
    [
        ("empty.md", b"", "empty file"),
        ("blank.txt", b"   \n\n  ", "empty file"),
        ("image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "not UTF-8"),
        ("scan.pdf", None, "PDF without text"),
        ("broken.pdf", b"%PDF-1.4 this is not really a pdf", "unreadable PDF"),
        ("notes.docx", b"PK\x03\x04", "unsupported file type .docx"),
        ("only-bad.jsonl", b"{oops\n", "line 1: not JSON"),
    ],
)
def test_bad_input_gets_a_clear_reason(source, data, reason):
    if data is None:
        data = blank_pdf()
    with pytest.raises(ExtractionError, match=reason):
        extract(source=source, data=data)
