"""The stepped Locust harness for TPS, TTFT, TPOT and GPU utilization.

`locust -f loadtest/` loads only loadtest/locustfile.py: every other module's name
starts with `_`, so Locust skips it (and this file) and sees one user class and one
shape. This file is the package's public face: other packages and users import what is
named in `__all__` from `loadtest`, never a `loadtest._x` module. Nothing here imports
Locust or gevent, so reading and rendering reports stays cheap.
"""

from loadtest._compare import render_comparison
from loadtest._console import table
from loadtest._diagnosis import LIMITS, diagnose, headline
from loadtest._report import ReportError, read_report, render_run
from loadtest._report_cli import main as report_main
from loadtest._schema import RunReport
from loadtest._settings import Settings, SettingsError, load_settings, parse_settings
from loadtest._workload import Session, Workload

__all__ = [
    "LIMITS",
    "ReportError",
    "RunReport",
    "Session",
    "Settings",
    "SettingsError",
    "Workload",
    "diagnose",
    "headline",
    "load_settings",
    "parse_settings",
    "read_report",
    "render_comparison",
    "render_run",
    "report_main",
    "table",
]
