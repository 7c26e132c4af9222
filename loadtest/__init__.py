"""The stepped Locust harness for TPS, TTFT, TPOT and GPU utilization.

`locust -f loadtest/` loads only loadtest/locustfile.py: every other module's name
starts with `_`, so Locust skips it (and this file) and sees one user class and one
shape. This file is the package's public face: other packages and users import what is
named in `__all__` from `loadtest`, never a `loadtest._x` module. Importing it (or any
module that reads or renders reports) loads no Locust, gevent or matplotlib: a tool
that only reads report.json does not pay for a load generator; plots import
matplotlib when they draw (tests/test_structure.py holds this).
"""

from loadtest._compare import render_comparison
from loadtest._console import table
from loadtest._curves import Curve, CurveStyle, curve_styles, draw_curves
from loadtest._diagnosis import LIMITS, diagnose, headline
from loadtest._ratios import StepFigures, ratio_line, ratio_lines, report_ratio_lines
from loadtest._report import ReportError, read_report, render_run
from loadtest._report_cli import main as report_main
from loadtest._schema import RunReport
from loadtest._settings import Settings, SettingsError, load_settings, parse_settings
from loadtest._workload import Session, Workload

__all__ = [
    "LIMITS",
    "Curve",
    "CurveStyle",
    "ReportError",
    "RunReport",
    "Session",
    "Settings",
    "SettingsError",
    "StepFigures",
    "Workload",
    "curve_styles",
    "diagnose",
    "draw_curves",
    "headline",
    "load_settings",
    "parse_settings",
    "ratio_line",
    "ratio_lines",
    "read_report",
    "render_comparison",
    "render_run",
    "report_main",
    "report_ratio_lines",
    "table",
]
