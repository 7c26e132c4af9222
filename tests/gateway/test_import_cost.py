"""A gateway process imports the clients of optional parts only when its config uses them: redis
(~0.6 s of CPU at each start, with the OpenTelemetry SDK it brings), psycopg, the OTLP exporter.
Each start pays for what it imports: every worker of `--workers N`, every restart."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO

OPTIONAL = ("redis", "psycopg", "opentelemetry")


def test_the_gateway_app_imports_no_optional_client() -> None:
    probe = (
        "import sys, gateway.app, gateway.gateway; "
        f"print(sorted({{name.split('.')[0] for name in sys.modules}} & set({OPTIONAL!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported at start: {out.stdout.strip()}"
