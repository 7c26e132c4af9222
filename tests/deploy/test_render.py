"""tests/render.py: headless Chromium against a real local HTTP server, with a page whose
content only appears after its script ran (as Prometheus's console graphs do)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from tests.deploy.pictures import count_colour, ink_fraction, size
from tests.render import RenderError, chromium_path, dump_dom, render_png
from tests.support import serving
from tests.tools import require_tool

PAGE = """<!doctype html><html><body style="margin:0;background:#fff">
<div id="late"></div><canvas id="c" width="300" height="200"></canvas>
<script>
setTimeout(function () {
  document.getElementById("late").textContent = "drawn-after-timeout";
  var g = document.getElementById("c").getContext("2d");
  g.fillStyle = "rgb(220, 20, 20)";
  g.fillRect(0, 0, 300, 200);
}, 700);
</script></body></html>"""


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site(tmp_path: Path) -> Iterator[str]:
    require_tool("chromium")
    (tmp_path / "page.html").write_text(PAGE)
    with serving(functools.partial(QuietFiles, directory=str(tmp_path))) as url:
        yield url + "/page.html"


def test_render_png_waits_for_scripts(site: str, tmp_path: Path) -> None:
    out = render_png(site, tmp_path / "shots" / "page.png", width=640, height=400, wait_ms=2000)
    assert out == (tmp_path / "shots" / "page.png").resolve()
    assert size(out) == (640, 400)
    red = count_colour(out, (220, 20, 20))
    assert red >= 0.9 * 300 * 200, f"the canvas drawn after 700 ms is missing ({red} red pixels)"
    assert 0.1 < ink_fraction(out) < 0.5


def test_render_png_before_the_script_ran_is_blank(site: str, tmp_path: Path) -> None:
    """The check above can fail: with no time for the script, the picture has no canvas."""
    out = render_png(site, tmp_path / "early.png", width=640, height=400, wait_ms=0)
    assert count_colour(out, (220, 20, 20)) == 0


def test_dump_dom_has_script_output(site: str) -> None:
    assert "drawn-after-timeout" in dump_dom(site, wait_ms=2000)


def test_missing_browser_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZEROGAP_CHROMIUM", str(tmp_path / "no-such-browser"))
    monkeypatch.setattr("tests.render.DEFAULT_CHROMIUM", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RenderError, match="setup-system"):
        chromium_path()


def test_render_png_of_a_local_file(tmp_path: Path) -> None:
    """Reports on disk (report.html) render from a file:// URL, as the README's pictures do."""
    require_tool("chromium")
    page = tmp_path / "report.html"
    page.write_text(PAGE)
    out = render_png(page.as_uri(), tmp_path / "report.png", width=500, height=300, wait_ms=2000)
    assert count_colour(out, (220, 20, 20)) > 0.5 * 300 * 200
