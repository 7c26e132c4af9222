"""The one HTML page shell: the title and pictures' names are escaped, a page's own style rules come after
the base style (so they win a tie), and the run report, the comparison and tune's report all use it."""

from __future__ import annotations

from pathlib import Path

from common.config import Config
from common.html_page import BASE_STYLE, html_page, image_html
from loadtest import render_comparison, render_run
from tests.loadtest.report_files import Figures, write_report
from zerogap.tune.grid import Candidate
from zerogap.tune.rank import Result
from zerogap.tune.render import write_all
from zerogap.tune.trial import Trial

SHELL_HEAD = "<!doctype html><html><head><meta charset=utf-8><title>"


def test_the_title_is_escaped_and_the_pages_style_follows_the_base() -> None:
    page = html_page("a <b> & c", ["<h1>x</h1>", "<p>y</p>"], "td{color:red}")
    assert page.startswith(SHELL_HEAD + "a &lt;b&gt; &amp; c</title>")
    assert f"<style>{BASE_STYLE}td{{color:red}}</style>" in page
    assert page.endswith("<body>\n<h1>x</h1>\n<p>y</p>\n</body></html>\n")


def test_a_pictures_name_and_alt_text_are_escaped() -> None:
    assert image_html('a"b.png', "x<y") == '<p><img src="a&quot;b.png" alt="x&lt;y"></p>'


def _tuned() -> Result:
    step = {"concurrency": 8, "output_tps": 1000.0, "goodput_rps": 10.0, "gpu_util": {"mean": 90.0, "min": 80.0}}
    return Result(Candidate(settings={"scheduler.max_num_seqs": 8}, config=Config()), [step], [])


def test_the_run_report_the_comparison_and_tunes_report_share_the_shell(tmp_path: Path) -> None:
    figures = [Figures(8, 1000.0, 90.0, 100.0, 20.0)]
    run = write_report(tmp_path / "run", figures)
    pages = {
        "run": render_run(run),
        "comparison": render_comparison([run, run], ["a", "b"], tmp_path / "cmp"),
        "tune": write_all([_tuned()], Trial("sim", (8,), 10.0, 5.0, 0.0, 128, 64, 2000.0, 100.0), tmp_path / "t"),
    }
    for name, path in pages.items():
        text = path.read_text(encoding="utf-8")
        assert text.startswith(SHELL_HEAD) and f"<style>{BASE_STYLE}" in text, name
        assert text.endswith("\n</body></html>\n"), name
