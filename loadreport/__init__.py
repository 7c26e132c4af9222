"""A load test's report side: settings.json, the load schedule (its steps in time), the request records, the per-step
summary and its diagnosis, report.json (schema.py: the typed contract) and timeline.csv,
report.html with its PNGs, the console table, and `zerogap report` (report_cli.py).

Nothing here imports Locust, gevent or matplotlib at import time (plots.py imports matplotlib
when it draws): a tool that only reads report.json pays for no load generator
(tests/test_structure.py holds this). The live run is loadgen/; it imports this package, never
the reverse. Packages that only read reports (backends/sim's calibrate and plan) import the names
below from `loadreport`; everything else of the load test comes from `loadtest`.
"""

from loadreport.ratios import StepFigures, ratio_lines
from loadreport.report import ReportError, read_report

__all__ = ["ReportError", "StepFigures", "ratio_lines", "read_report"]
