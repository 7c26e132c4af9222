"""Looking at rendered console pages: how much of a PNG is not background, and its colours; and
each page's graphs as headless Chromium drew them (their x range and where their data lies)."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from tests.render import inspect_page


def rgb(png: Path) -> NDArray[np.int16]:
    """The picture as a height x width x 3 array of signed ints (so differences do not wrap)."""
    with Image.open(png) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def ink_fraction(png: Path, background: tuple[int, int, int] = (255, 255, 255), tolerance: int = 16) -> float:
    """The share of pixels that differ from the background colour by more than tolerance."""
    far = np.abs(rgb(png) - np.array(background, dtype=np.int16)).max(axis=2) > tolerance
    return float(far.mean())


def count_colour(png: Path, colour: tuple[int, int, int], tolerance: int = 30) -> int:
    near = np.abs(rgb(png) - np.array(colour, dtype=np.int16)).max(axis=2) <= tolerance
    return int(near.sum())


def size(png: Path) -> tuple[int, int]:
    with Image.open(png) as image:
        width, height = image.size
        return width, height


# ----- the graphs as Chromium drew them -----

# A page that loads console pages in iframes (same origin) and, once every graph of every page
# is drawn or has failed, writes what each page shows into <pre id="zg-facts"> as JSON: the
# range its time control states, per graph the range prom_console.js queried, the x domain that
# Rickshaw drew and the first and last x with a finite value, any "NaN" in the page's text, and
# where the links to the other pages lead. A page may name a button to click once it is drawn
# (its facts are read after the click).
# The frames are 800 px wide: a graph queries one point per pixel, and the range does not depend on it.
_PROBE_PAGE = """<!doctype html>
<html><body><pre id="zg-facts">waiting</pre>
<script>
var pages = PAGES;
var frames = pages.map(function (page) {
  var frame = document.createElement("iframe");
  frame.style.width = "800px"; frame.style.height = "1600px"; frame.src = page.url;
  document.body.appendChild(frame);
  return frame;
});
function graphFacts(graph) {
  var failed = graph.graphTd.querySelector(".prom_graph_error");
  if (graph.rickshawGraph === null && failed === null) { return null; }
  var fact = {expr: graph.params.expr, duration_s: graph.params.duration, end_s: graph.params.endTime,
              error: failed === null ? null : failed.textContent, domain: null, first_x: null, last_x: null,
              first_busy_x: null, last_busy_x: null};
  if (graph.rickshawGraph !== null) {
    fact.domain = graph.rickshawGraph.x.domain();
    graph.rickshawGraph.series.forEach(function (series) {
      series.data.forEach(function (point) {
        if (point.y === null || !isFinite(point.y)) { return; }
        if (fact.first_x === null || point.x < fact.first_x) { fact.first_x = point.x; }
        if (fact.last_x === null || point.x > fact.last_x) { fact.last_x = point.x; }
        if (point.y === 0) { return; }
        if (fact.first_busy_x === null || point.x < fact.first_busy_x) { fact.first_busy_x = point.x; }
        if (fact.last_busy_x === null || point.x > fact.last_busy_x) { fact.last_busy_x = point.x; }
      });
    });
  }
  return fact;
}
function pageFacts(win) {
  if (win.document.readyState !== "complete" || win.PromConsole === undefined) { return null; }
  var graphs = [];
  for (var i = 0; i < win.PromConsole._graph_registry.length; i++) {
    var fact = graphFacts(win.PromConsole._graph_registry[i]);
    if (fact === null) { return null; }
    graphs.push(fact);
  }
  var texts = [win.document.body.innerText];
  win.document.querySelectorAll("svg text").forEach(function (t) { texts.push(t.textContent); });
  var nan = texts.join("\\n").split("\\n").filter(function (line) { return line.indexOf("NaN") >= 0; });
  var nav = [];
  win.document.querySelectorAll("a.zg-nav").forEach(function (a) { nav.push(a.getAttribute("href")); });
  var range = win.document.getElementById("prom_graph_duration").value;
  return {range_text: range, graphs: graphs, nan_lines: nan, nav: nav};
}
function poll() {
  var facts = {};
  for (var i = 0; i < frames.length; i++) {
    var page = pageFacts(frames[i].contentWindow);
    if (page !== null && pages[i].click && !pages[i].clicked) {
      frames[i].contentWindow.document.getElementById(pages[i].click).click();
      pages[i].clicked = true;
      page = null;
    }
    if (page === null) {
      document.getElementById("zg-facts").textContent = "waiting for " + pages[i].url;
      setTimeout(poll, 100);
      return;
    }
    facts[pages[i].name] = page;
  }
  document.getElementById("zg-facts").textContent = JSON.stringify(facts);
}
poll();
</script></body></html>
"""
_FACTS = re.compile(r'<pre id="zg-facts">(.*?)</pre>', re.DOTALL)
_DURATION = re.compile(r"^([0-9]+)([ywdhms]?)$")
_UNIT_S = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}


@dataclass(frozen=True)
class DrawnGraph:
    """One PromConsole graph as drawn: the range it queried, Rickshaw's x domain, its finite data."""

    expr: list[str]
    duration_s: float
    end_s: float
    error: str | None
    domain: tuple[float, float] | None
    first_x: float | None
    last_x: float | None
    first_busy_x: float | None = None  # the first and last x of a value that is not 0 (a run's, for a rate)
    last_busy_x: float | None = None

    @property
    def domain_s(self) -> float:
        return 0.0 if self.domain is None else self.domain[1] - self.domain[0]

    @property
    def data_share(self) -> float:
        """The share of the x axis between the first and the last finite value (0 without data)."""
        if self.first_x is None or self.last_x is None or not self.domain_s:
            return 0.0
        return (self.last_x - self.first_x) / self.domain_s

    @property
    def busy_share(self) -> float:
        """The share of the x axis between the first and the last value that is not 0 (0 without one)."""
        if self.first_busy_x is None or self.last_busy_x is None or not self.domain_s:
            return 0.0
        return (self.last_busy_x - self.first_busy_x) / self.domain_s


@dataclass(frozen=True)
class DrawnPage:
    range_text: str  # what the time control says, e.g. "15m"
    graphs: list[DrawnGraph]
    nan_lines: list[str]  # lines of the page's text with "NaN" in them
    nav_hrefs: list[str]  # the links to the console pages, as the page has set them

    @property
    def range_s(self) -> int:
        """The stated range in seconds, as prom_console.js reads "15m"."""
        match = _DURATION.match(self.range_text)
        assert match, f"the time control states {self.range_text!r}"
        return int(match.group(1)) * _UNIT_S[match.group(2)]


def drawn_pages(
    prometheus_url: str,
    consoles: Path,
    urls: dict[str, str],
    wait_ms: int = 30000,
    clicks: dict[str, str] | None = None,
) -> dict[str, DrawnPage]:
    """Load the console pages (name -> URL relative to /consoles/, served from the consoles folder
    given) in one headless Chromium and read what each one drew; clicks: name -> the id of a
    button to click on that page once it is drawn."""
    probe = consoles / "zg-range-probe.html"
    pages = [{"name": name, "url": url, "click": (clicks or {}).get(name)} for name, url in urls.items()]
    probe.write_text(_PROBE_PAGE.replace("PAGES", json.dumps(pages)))
    dom = inspect_page(f"{prometheus_url}/consoles/{probe.name}", height=1600, wait_ms=wait_ms).dom
    found = _FACTS.search(dom)
    text = html.unescape(found.group(1)) if found else "no facts element"
    assert text.startswith("{"), f"the pages did not finish drawing: {text}"
    out: dict[str, DrawnPage] = {}
    for name, page in json.loads(text).items():
        graphs = [_drawn_graph(g) for g in page["graphs"]]
        out[name] = DrawnPage(page["range_text"], graphs, page["nan_lines"], page["nav"])
    return out


def _drawn_graph(fact: dict[str, Any]) -> DrawnGraph:
    domain = fact["domain"]
    return DrawnGraph(
        expr=fact["expr"],
        duration_s=float(fact["duration_s"]),
        end_s=float(fact["end_s"]),
        error=fact["error"],
        domain=(float(domain[0]), float(domain[1])) if domain else None,
        first_x=fact["first_x"],
        last_x=fact["last_x"],
        first_busy_x=fact["first_busy_x"],
        last_busy_x=fact["last_busy_x"],
    )
