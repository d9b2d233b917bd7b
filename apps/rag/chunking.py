"""Splits a document's text into chunks the embedding model can read whole.

Sizes are counted in the model's own word pieces, so a chunk of `size` tokens is never truncated
by the model (256 with [CLS]/[SEP] and a short title in front). Sections (markdown headings, PDF
page breaks) are never merged into one chunk; inside a section a chunk ends, by preference, at a
paragraph, then a sentence, then a line, then a word boundary, at least half-full; the next chunk
starts `overlap` tokens before that end (moved back to the start of the word there), so a fact cut
by a boundary is whole in one of the two. Every character of the text lies in some chunk's span.

A section that holds nothing but its heading (a title followed at once by a subheading) is no
passage of its own: alone it matches every question that shares a word with the title and
answers none. It joins the section after it, so its words still lie in a chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from apps.rag.embeddings import get_tokenizer

HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)
PAGE_BREAK = "\f"
HEADING_SEPARATOR = " > "
CHUNKING_VERSION = 2  # raised whenever the same text and sizes give other chunks

# Boundary strength before a token: where a chunk may end (higher is better).
NONE, WORD, LINE, SENTENCE, PARAGRAPH = 0, 1, 2, 3, 4
SENTENCE_END = {".", "!", "?", ":", ";"}


@dataclass(frozen=True)
class Section:
    start: int  # character offsets into the document
    end: int
    heading: str  # "Install > Redis", joined by HEADING_SEPARATOR
    page: int | None


@dataclass
class Chunk:
    ordinal: int
    text: str
    char_start: int
    char_end: int
    token_count: int
    heading: str
    page: int | None = None
    # Token positions inside the section (for tests of the overlap property).
    token_start: int = 0
    token_end: int = 0
    section: int = 0
    metadata: dict = field(default_factory=dict)


def validate(size: int, overlap: int) -> None:
    if size < 8:
        raise ValueError(f"chunk size must be at least 8 tokens, not {size}")
    if overlap < 0 or overlap >= size // 2:
        raise ValueError(f"overlap must be between 0 and {size // 2 - 1} tokens, not {overlap}")


def sections(text: str) -> list[Section]:
    """Splits at markdown headings (outside code fences) and at page breaks (\\f)."""
    fenced = _fenced_ranges(text)
    cuts: list[tuple[int, int, str]] = []  # (offset, level, title); level 0 = page break
    for match in HEADING.finditer(text):
        if not any(a <= match.start() < b for a, b in fenced):
            cuts.append((match.start(), len(match.group(1)), match.group(2).strip()))
    for match in re.finditer(PAGE_BREAK, text):
        cuts.append((match.start(), 0, ""))
    cuts.sort()
    out: list[Section] = []
    stack: list[tuple[int, str]] = []  # open headings (level, title)
    page = 1 if PAGE_BREAK in text else None
    position = 0
    for offset, level, title in cuts:
        if offset > position:
            out.append(Section(position, offset, _path(stack), page))
        position = offset
        if level == 0:
            page = (page or 1) + 1
            position = offset + 1  # the \f itself belongs to no chunk
        else:
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
    if position < len(text):
        out.append(Section(position, len(text), _path(stack), page))
    return _join_bare_headings(text, [s for s in out if text[s.start : s.end].strip()])


def _join_bare_headings(text: str, found: list[Section]) -> list[Section]:
    """Each section that is only its heading line, merged into the next one on the same page."""
    out: list[Section] = []
    pending: Section | None = None
    for section in found:
        if pending is not None and pending.page == section.page:
            section = Section(pending.start, section.end, section.heading, section.page)
        elif pending is not None:
            out.append(pending)
        pending = None
        if _bare_heading(text[section.start : section.end]):
            pending = section
        else:
            out.append(section)
    if pending is not None:
        out.append(pending)
    return out


def _bare_heading(body: str) -> bool:
    match = HEADING.match(body.strip())
    return match is not None and match.end() == len(body.strip())


def chunk_text(text: str, *, size: int, overlap: int) -> list[Chunk]:
    validate(size, overlap)
    tokenizer = get_tokenizer()
    chunks: list[Chunk] = []
    for number, section in enumerate(sections(text)):
        body = text[section.start : section.end]
        encoding = tokenizer.encode(body, add_special_tokens=False)
        offsets = encoding.offsets
        if not offsets:
            continue
        strength = _boundaries(body, encoding.tokens, offsets)
        for token_start, token_end, char_start, char_end in _windows(
            body, offsets, strength, size=size, overlap=overlap
        ):
            raw = body[char_start:char_end]
            lead = len(raw) - len(raw.lstrip())
            piece = raw.strip()
            chunks.append(
                Chunk(
                    ordinal=len(chunks),
                    text=piece,
                    char_start=section.start + char_start + lead,
                    char_end=section.start + char_start + lead + len(piece),
                    token_count=token_end - token_start,
                    heading=section.heading,
                    page=section.page,
                    token_start=token_start,
                    token_end=token_end,
                    section=number,
                )
            )
    return chunks


def _windows(body: str, offsets, strength: list[int], *, size: int, overlap: int):
    """Yields (token_start, token_end, char_start, char_end) for one section."""
    n = len(offsets)
    start, previous_end, previous_char_end = 0, 0, None
    while True:
        limit = min(start + size, n)
        if limit == n:
            end = n
        else:
            low = max(start + size // 2, previous_end + 1, start + 1)
            end = _best_boundary(strength, low, limit) or limit
        # The first chunk starts at the section start and the last ends at the section end, and
        # each starts no later than its predecessor ended: together they cover every character,
        # also those the tokenizer skips.
        char_start = 0 if previous_char_end is None else offsets[start][0]
        if previous_char_end is not None:
            char_start = min(char_start, previous_char_end)
        char_end = len(body) if end == n else offsets[end - 1][1]
        yield start, end, char_start, char_end
        if end == n:
            return
        following = end - overlap
        while following > 0 and strength[following] == NONE:  # back to the word's start
            following -= 1
        start, previous_end, previous_char_end = max(following, start + 1), end, char_end


def _best_boundary(strength: list[int], low: int, high: int) -> int | None:
    best, best_strength = None, NONE
    for index in range(high, low - 1, -1):
        if strength[index] > best_strength:
            best, best_strength = index, strength[index]
            if best_strength == PARAGRAPH:
                break
    return best


def _boundaries(body: str, tokens: list[str], offsets) -> list[int]:
    """strength[i]: how good a chunk boundary lies just before token i (len(tokens)+1 entries)."""
    strength = [NONE] * (len(tokens) + 1)
    strength[0] = PARAGRAPH
    strength[-1] = PARAGRAPH
    for i in range(1, len(tokens)):
        gap = body[offsets[i - 1][1] : offsets[i][0]]
        if tokens[i].startswith("##") and not gap:
            continue  # inside a word
        if "\n" in gap and gap.count("\n") >= 2:
            strength[i] = PARAGRAPH
        elif "\n" in gap:
            strength[i] = LINE
        elif tokens[i - 1] in SENTENCE_END and gap:
            strength[i] = SENTENCE
        else:
            strength[i] = WORD
    return strength


def _fenced_ranges(text: str) -> list[tuple[int, int]]:
    marks = [m.start() for m in FENCE.finditer(text)]
    return [(marks[i], marks[i + 1]) for i in range(0, len(marks) - 1, 2)]


def _path(stack: list[tuple[int, str]]) -> str:
    return HEADING_SEPARATOR.join(title for _, title in stack)[:500]
