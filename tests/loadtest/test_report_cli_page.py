"""report.html for a person: the run's facts in sentences (no raw keys, no None), and the steps table
whole at 1280 px in real headless Chromium (it fits, or scrolls inside its own box)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from loadtest import render_comparison, render_run
from tests.loadtest.report_files import RUN, Figures, write_report
from tests.render import chromium_path, inspect_page

WIDE = [Figures(64, 23456.7, 97.0, 1234.5, 45.6), Figures(256, 123456.7, 99.0, 12345.6, 123.4)]
PROBE = """<script>
const tables = [...document.querySelectorAll("table.steps")].map((table) => {
  const head = table.rows[0].cells;
  const box = table.parentElement;
  return {last_right: head[head.length - 1].getBoundingClientRect().right, overflow_x: getComputedStyle(box).overflowX,
          box_right: box.getBoundingClientRect().right, scroll_width: box.scrollWidth, client_width: box.clientWidth};
});
const probe = document.createElement("pre");
probe.id = "probe";
probe.textContent = JSON.stringify({viewport: document.documentElement.clientWidth, tables});
document.body.appendChild(probe);
</script>"""


def _measure(page: Path, width_px: int) -> dict[str, Any]:
    """The steps tables' layout in Chromium at width_px (the page with a measuring script added)."""
    probed = page.with_name("probe-" + page.name)
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = inspect_page(probed.as_uri(), width=width_px, height=900, wait_ms=0).dom
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found, dom[-2000:]
    layout: dict[str, Any] = json.loads(found.group(1))
    return layout


def test_the_header_says_the_runs_facts_in_sentences_without_none_or_raw_keys(tmp_path: Path) -> None:
    run = write_report(tmp_path / "run", WIDE, interrupted_requests=32)
    page = render_run(run).read_text(encoding="utf-8")
    assert "None" not in page
    for key in (*RUN, "stopped_early"):
        assert f"{key}:" not in page and f"{key}=" not in page, key
    assert "32 requests were still streaming when the test stopped" in page
    assert "count neither as successes nor as failures" in page
    assert "Target: model tiny at http://127.0.0.1:8000/v1/chat/completions." in page
    assert "closed loop: each user sends its next request when its last one ends" in page
    assert "Stopped early" not in page  # it did not
    stopped = write_report(tmp_path / "stopped", WIDE, stopped_early="TTFT p99 above 30 s", interrupted_requests=0)
    page = render_run(stopped).read_text(encoding="utf-8")
    assert "Stopped early: TTFT p99 above 30 s." in page
    assert "still streaming" not in page  # no request was cut off


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_path()


def test_the_steps_table_fits_1280_px(tmp_path: Path, chromium: str) -> None:
    layout = _measure(render_run(write_report(tmp_path / "run", WIDE)), 1280)
    assert layout["viewport"] >= 1200, layout  # the window is the size asked for (less a scrollbar)
    [table] = layout["tables"]
    assert table["last_right"] <= layout["viewport"], layout


def test_a_comparisons_steps_tables_show_their_last_column_at_1280_px(tmp_path: Path, chromium: str) -> None:
    runs = [write_report(tmp_path / name, WIDE) for name in ("a", "b")]
    labels = ["max_num_seqs=256 async_scheduling=true", "max_num_seqs=512 async_scheduling=false"]
    layout = _measure(render_comparison(runs, labels, tmp_path / "cmp"), 1280)
    assert len(layout["tables"]) == 2, layout
    for table in layout["tables"]:
        fits = table["last_right"] <= layout["viewport"]
        scrolls = table["overflow_x"] in ("auto", "scroll") and table["box_right"] <= layout["viewport"]
        assert fits or scrolls, layout
