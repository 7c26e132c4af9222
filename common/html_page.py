"""The HTML page shell of every page zerogap writes (a run's report.html, runs side by
side, tune's report.html): one doctype, charset, escaped title and base style; each page
adds its own style rules and body."""

from __future__ import annotations

import html
from collections.abc import Iterable

BASE_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1300px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:4px 6px;text-align:right}th{background:#f3f3f3}img{max-width:100%}"
    ".note{color:#555}"
)


def html_page(title: str, body: Iterable[str], style: str = "") -> str:
    """A whole document: `title` (plain text, escaped here), BASE_STYLE then `style` (its rules win a tie),
    and the body's parts (HTML, as given) one per line."""
    head = f"<meta charset=utf-8><title>{html.escape(title)}</title><style>{BASE_STYLE}{style}</style>"
    return f"<!doctype html><html><head>{head}</head><body>\n" + "\n".join(body) + "\n</body></html>\n"


def image_html(src: str, alt: str) -> str:
    """A picture in its own paragraph; src and alt are plain text (escaped here)."""
    return f'<p><img src="{html.escape(src)}" alt="{html.escape(alt)}"></p>'
