"""Model output is untrusted text. It becomes HTML only through here: Markdown with raw HTML
disabled, then sanitised by nh3 (an allow-list), so no script or handler attribute survives.

Fenced code that names its language is highlighted by Pygments on this (final) render: the
spans it adds carry only class names, which static/css/sluice.css colours for light and dark.
Streaming text is shown plain; the final frame replaces it with this HTML.
"""

from __future__ import annotations

from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Escaped code in classed spans, without a wrapping <pre> (markdown-it adds <pre><code>).
_formatter = HtmlFormatter(nowrap=True)
# Past this a block is shown plain: highlighting is for reading, not for pasted logs.
MAX_HIGHLIGHT_CHARS = 20_000


def _highlight(code: str, lang: str, attrs: str) -> str:
    """Highlighted HTML for a fenced block, or "" to let markdown-it escape it plainly."""
    if not lang or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang.strip().lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return highlight(code, lexer, _formatter)


_markdown = MarkdownIt(
    "commonmark", {"html": False, "linkify": False, "highlight": _highlight}
).enable("table")

ALLOWED_TAGS = {
    "p",
    "br",
    "strong",
    "em",
    "code",
    "pre",
    "blockquote",
    "ul",
    "ol",
    "li",
    "a",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "del",
    "sup",
    "sub",
    "span",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "span": {"class"},
    "th": {"align"},
    "td": {"align"},
}


# The same answer is rendered for every socket that follows it and on every page load.
@lru_cache(maxsize=256)
def render_markdown(text: str) -> str:
    html = _markdown.render(text or "")
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
