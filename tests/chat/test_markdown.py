from __future__ import annotations

from core.markdown import render_markdown


def test_markdown_renders_code_blocks_and_emphasis():
    html = render_markdown("**bold** and `x`\n\n```\nprint(1 < 2)\n```")
    assert "<strong>bold</strong>" in html
    assert "<pre><code>print(1 &lt; 2)" in html


def test_code_with_a_language_is_highlighted_by_pygments_and_stays_escaped():
    html = render_markdown("```python\nprint(1 < 2)  # <b>hi</b>\n```")
    assert '<pre><code class="language-python">' in html
    assert '<span class="nb">print</span>' in html  # a builtin, coloured by code.css
    assert '<span class="c1"># &lt;b&gt;hi&lt;/b&gt;</span>' in html
    # An unknown language is shown plain, escaped.
    assert render_markdown("```nosuchlang\na<b\n```") == (
        '<pre><code class="language-nosuchlang">a&lt;b\n</code></pre>\n'
    )


def test_model_output_cannot_inject_html_or_scripts():
    html = render_markdown(
        "<script>alert(1)</script><img src=x onerror=alert(1)> [x](javascript:alert(1))"
        '<span class="k" onclick="x()">s</span>'
    )
    assert "<script" not in html and "<img" not in html and "<span" not in html
    assert 'href="javascript' not in html
