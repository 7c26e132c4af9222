"""tune's report.html: candidates that measured the same are all visible in the picture (the repeat
drawn dashed over the first, its legend entry saying so) and named in the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

from common.config import Config
from zerogap.tune.grid import Candidate
from zerogap.tune.rank import Result
from zerogap.tune.render import _plot, write_all
from zerogap.tune.trial import Trial

TRIAL = Trial("sim", (32, 128), 10.0, 5.0, 0.0, 128, 64, 2000.0, 100.0, virtual=True)
LINE = re.compile(r'<path d="[^"]*"[^>]*style="([^"]*)"')


def _result(max_num_seqs: int, tps: tuple[float, float], gpu: tuple[float, float]) -> Result:
    steps: list[dict[str, Any]] = [
        {"concurrency": load, "output_tps": t, "goodput_rps": t / 100, "gpu_util": {"mean": g, "min": g}}
        for load, t, g in zip(TRIAL.steps, tps, gpu, strict=True)
    ]
    candidate = Candidate(settings={"scheduler.max_num_seqs": max_num_seqs}, config=Config())
    return Result(candidate=candidate, steps=steps, diagnosis=[])


# four candidates, two pairs that measured exactly the same: before, the legend listed 4 and 2 lines showed
RANKED = [
    _result(256, (1000.0, 3000.0), (60.0, 95.0)),
    _result(512, (1000.0, 3000.0), (60.0, 95.0)),
    _result(64, (900.0, 1500.0), (55.0, 70.0)),
    _result(128, (900.0, 1500.0), (55.0, 70.0)),
]


def _strokes(svg: str, colour: str) -> set[tuple[str, str]]:
    """(dash array, width) of every line drawn in colour (plot and legend)."""
    found = set()
    for style in LINE.findall(svg):
        rules = dict(rule.split(": ", 1) for rule in style.split("; ") if ": " in rule)
        if rules.get("fill") == "none" and rules.get("stroke") == colour:
            found.add((rules.get("stroke-dasharray", "solid"), rules.get("stroke-width", "")))
    return found


def test_identical_candidates_are_drawn_so_each_shows(tmp_path: Path) -> None:
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        svg = _plot(RANKED, tmp_path / "tune.svg").read_text(encoding="utf-8")
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")  # C0..C3: one per candidate
    strokes = {colour: _strokes(svg, colour) for colour in colours}
    assert all(strokes.values()), strokes
    for first, repeat in ((colours[0], colours[1]), (colours[2], colours[3])):
        assert strokes[first] & strokes[repeat] == set(), strokes  # the repeat's line is not the first's
        assert all(dash != "solid" for dash, _ in strokes[repeat]), strokes  # dashed: the first shows through
    assert svg.count("max_num_seqs=512 (same as max_num_seqs=256)") == 2  # both panels' legends
    assert svg.count("max_num_seqs=128 (same as max_num_seqs=64)") == 2
    assert "max_num_seqs=64 (same as" not in svg and "max_num_seqs=256 (same as" not in svg


def test_the_page_names_the_candidates_that_measured_the_same(tmp_path: Path) -> None:
    page = write_all(RANKED, TRIAL, tmp_path).read_text(encoding="utf-8")
    assert "max_num_seqs=512 measured the same as max_num_seqs=256" in page
    assert "max_num_seqs=128 measured the same as max_num_seqs=64" in page
    assert (tmp_path / "tune.png").read_bytes().startswith(b"\x89PNG")
    assert "None" not in page  # a candidate without a diagnosis shows "-"


def test_a_candidate_the_same_in_one_panel_only_is_not_called_the_same(tmp_path: Path) -> None:
    ranked = [_result(256, (1000.0, 3000.0), (60.0, 95.0)), _result(512, (1000.0, 3000.0), (50.0, 90.0))]
    page = write_all(ranked, TRIAL, tmp_path).read_text(encoding="utf-8")
    assert "measured the same" not in page
