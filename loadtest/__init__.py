"""The stepped Locust harness for TPS, TTFT, TPOT and GPU utilization: the locustfile folder
and the public face.

`locust -f loadtest/` imports every .py file in this folder whose name does not start with
`_`: only locustfile.py, so Locust sees one user class and one shape. The library lives
beside it, in two packages with plain names:

- loadreport/: what a run's figures become and how they are read back (settings.json, the
  load schedule, the records, per-step summary, diagnosis, report.json and its schema, timeline.csv,
  report.html, the console table, `zerogap report`). It imports no Locust, gevent or
  matplotlib (plots import matplotlib when they draw): a tool that only reads report.json
  does not pay for a load generator.
- loadgen/: the live run under Locust and gevent (the harness, the streaming client, the
  arrivals, the backend scrapes and samplers, workers, the web UI tab, the exporter, progress).
  loadgen imports loadreport, never the other way round.

Other packages and users import what is named in `__all__` from `loadtest`. Importing it
loads no Locust, gevent or matplotlib (tests/test_structure.py holds this).
"""

from loadgen.workload import Session, Workload
from loadreport.compare import render_comparison
from loadreport.console import table
from loadreport.curves import Curve, CurveStyle, curve_styles, draw_curves
from loadreport.diagnosis import LIMITS, diagnose, headline
from loadreport.ratios import StepFigures, ratio_line, ratio_lines, report_ratio_lines
from loadreport.report import ReportError, read_report, render_run
from loadreport.report_cli import main as report_main
from loadreport.schema import RunReport
from loadreport.settings import Settings, SettingsError, load_settings, parse_settings

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
