from __future__ import annotations

from apps.chat.markdown import render_markdown


def test_markdown_renders_code_blocks_and_emphasis():
    html = render_markdown("**bold** and `x`\n\n```python\nprint(1 < 2)\n```")
    assert "<strong>bold</strong>" in html
    assert '<pre><code class="language-python">print(1 &lt; 2)' in html


def test_model_output_cannot_inject_html_or_scripts():
    html = render_markdown(
        "<script>alert(1)</script><img src=x onerror=alert(1)> [x](javascript:alert(1))"
    )
    assert "<script" not in html and "<img" not in html
    assert 'href="javascript' not in html
