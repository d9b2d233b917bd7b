"""Turns a file's bytes into documents' text: .txt, .md, .html, .pdf, and .jsonl (one document
per line). Anything it cannot read raises ExtractionError with a sentence an operator can act on.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import unicodedata
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import PurePath

SUPPORTED = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf", ".jsonl")


class ExtractionError(Exception):
    """The file cannot become a document; the message says why, for the ingestion summary."""


@dataclass
class Extracted:
    source: str
    title: str
    kind: str
    content: str
    checksum: str
    metadata: dict = field(default_factory=dict)


def extract(*, source: str, data: bytes) -> tuple[list[Extracted], list[str]]:
    """(documents, warnings) in one file: several documents for .jsonl, whose unreadable lines
    become warnings. Raises ExtractionError when nothing in the file can be used."""
    suffix = PurePath(source).suffix.lower()
    if suffix not in SUPPORTED:
        raise ExtractionError(
            f"unsupported file type {suffix or '(none)'}; supported: {', '.join(SUPPORTED)}"
        )
    if not data.strip():
        raise ExtractionError("empty file")
    checksum = hashlib.sha256(data).hexdigest()
    if suffix == ".pdf":
        return [_pdf(source, data, checksum)], []
    text = _decode(data)
    if suffix == ".jsonl":
        return _jsonl(source, text)
    if suffix in (".html", ".htm"):
        title, content = _html(text)
        kind = "html"
    else:
        content = text
        kind = "md" if suffix in (".md", ".markdown") else "txt"
        title = _markdown_title(content) if kind == "md" else ""
    content = normalize(content)
    if not content.strip():
        raise ExtractionError("no text in the file")
    return [Extracted(source, title or _title_from_name(source), kind, content, checksum)], []


def normalize(text: str) -> str:
    """NFC, \\n line ends, no control or invisible format characters, at most one blank line."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = "".join(
        ch
        for ch in text
        if ch in "\n\t\f"
        or (unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co") and ch != "\ufffd")
    )
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def _decode(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ExtractionError("binary file (contains NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ExtractionError(
            f"not UTF-8 text (byte {error.start}); convert it to UTF-8 first"
        ) from None


def _markdown_title(text: str) -> str:
    match = re.search(r"^#[ \t]+(.+?)[ \t#]*$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def _title_from_name(source: str) -> str:
    stem = PurePath(source.split("#", 1)[0]).stem
    return re.sub(r"[-_]+", " ", stem).strip().capitalize() or source


def _pdf(source: str, data: bytes, checksum: str) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("encrypted PDF; decrypt it first")
        # Pages joined by form feeds: the chunker never lets a chunk span two pages and
        # records each chunk's page number.
        pages = [normalize(page.extract_text() or "") for page in reader.pages]
        title = str((reader.metadata or {}).get("/Title") or "").strip()
    except ExtractionError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as error:
        raise ExtractionError(f"unreadable PDF ({error})") from None
    if not any(page.strip() for page in pages):
        raise ExtractionError("PDF without text (scanned images?); run OCR on it first")
    content = "\f".join(pages)
    return Extracted(
        source, title or _title_from_name(source), "pdf", content, checksum, {"pages": len(pages)}
    )


def _jsonl(source: str, text: str) -> tuple[list[Extracted], list[str]]:
    """One document per line: {"text": …, "title"?, "id"? or "url"?, "metadata"?: {…}}."""
    out: list[Extracted] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(f"line {number}: not a JSON object")
            continue
        body = record.get("text") or record.get("content") or record.get("body")
        if not isinstance(body, str) or not normalize(body):
            problems.append(f'line {number}: no "text"')
            continue
        ident = record.get("id") or record.get("url") or number
        metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        if record.get("url"):
            metadata = {**metadata, "url": str(record["url"])}
        out.append(
            Extracted(
                source=f"{source}#{ident}",
                title=str(record.get("title") or f"{_title_from_name(source)} {ident}")[:300],
                kind="jsonl",
                content=normalize(body),
                checksum=hashlib.sha256(line.encode()).hexdigest(),
                metadata=metadata,
            )
        )
    if not out:
        raise ExtractionError("; ".join(problems[:3]) or "no records")
    return out, problems


class _HtmlText(HTMLParser):
    BLOCK = {
        "p",
        "div",
        "section",
        "article",
        "li",
        "tr",
        "br",
        "pre",
        "blockquote",
        "table",
        "ul",
        "ol",
        "dl",
        "dt",
        "dd",
        "hr",
        "main",
        "header",
        "footer",
        "figure",
    }
    SKIP = {"script", "style", "noscript", "template", "svg", "head", "nav"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._in_title = False
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in self.BLOCK:
            self.parts.append("\n\n" if tag in ("p", "div", "section", "article") else "\n")
            if tag == "li":
                self.parts.append("- ")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) or tag in self.BLOCK:
            self.parts.append("\n\n" if tag[0] == "h" or tag == "p" else "\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.parts.append(re.sub(r"\s+", " ", data))


def _html(text: str) -> tuple[str, str]:
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    content = "".join(parser.parts)
    content = re.sub(r"\n[ \t]+", "\n", content)
    return parser.title.strip(), content
