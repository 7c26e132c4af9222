"""Render a web page with headless Chromium: to a PNG, or to its DOM after scripts ran.

Used by the deploy tests (Prometheus console dashboards) and for the README's pictures.
Every call uses a fresh, throw-away profile, no network besides the page's own, and a
hard deadline; Chromium's whole process group is killed when the deadline passes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_WAIT_MS = 5000
_CONSOLE = re.compile(r":INFO:CONSOLE[^\]]*\] (.*)$", re.MULTILINE)


class RenderError(RuntimeError):
    """Chromium is missing, failed, timed out, or wrote no picture."""


@dataclass(frozen=True)
class Page:
    """A page after its scripts ran: its DOM, and what it wrote to the JS console (errors included)."""

    dom: str
    console: list[str]

    @property
    def script_errors(self) -> list[str]:
        return [line for line in self.console if "Uncaught" in line or "Error" in line]


def chromium_path() -> str:
    """The browser to use: $ZEROGAP_CHROMIUM, else /usr/bin/chromium, else chromium on PATH."""
    for candidate in (os.environ.get("ZEROGAP_CHROMIUM"), DEFAULT_CHROMIUM, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RenderError("headless Chromium not found: install Debian's chromium (scripts/setup-system)")


def chromium_flags(profile: Path, width: int, height: int, wait_ms: int) -> list[str]:
    """Flags for a quiet, sandbox-free headless run that lets page scripts run for wait_ms of virtual time
    (0: take the page as it is once loaded)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--mute-audio",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ]
    return [*flags, f"--virtual-time-budget={wait_ms}"] if wait_ms > 0 else flags


def _run_chromium(
    tail: list[str], width: int, height: int, wait_ms: int, timeout_s: float
) -> subprocess.CompletedProcess[bytes]:
    """Run Chromium with a fresh profile and the given trailing arguments, killed at the deadline."""
    with tempfile.TemporaryDirectory(prefix="zerogap-chromium-") as profile:
        cmd = [chromium_path(), *chromium_flags(Path(profile), width, height, wait_ms), *tail]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RenderError(f"chromium did not finish within {timeout_s} s") from exc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def render_png(
    url: str,
    out: Path,
    width: int = 1400,
    height: int = 900,
    wait_ms: int = DEFAULT_WAIT_MS,
    timeout_s: float = 90.0,
) -> Path:
    """Screenshot url into out (a PNG of width x height) after wait_ms of virtual time; returns out."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    done = _run_chromium([f"--screenshot={out}", url], width, height, wait_ms, timeout_s)
    if not out.is_file() or out.stat().st_size == 0:
        detail = done.stderr.decode(errors="replace")[-2000:]
        raise RenderError(f"chromium wrote no screenshot for {url} (exit {done.returncode}): {detail}")
    return out


def inspect_page(
    url: str,
    width: int = 1400,
    height: int = 900,
    wait_ms: int = DEFAULT_WAIT_MS,
    timeout_s: float = 90.0,
) -> Page:
    """The page's DOM after its scripts ran for wait_ms of virtual time, and its console messages."""
    tail = ["--enable-logging=stderr", "--v=0", "--dump-dom", url]
    done = _run_chromium(tail, width, height, wait_ms, timeout_s)
    html = done.stdout.decode(errors="replace")
    if done.returncode != 0 or not html.strip():
        detail = done.stderr.decode(errors="replace")[-2000:]
        raise RenderError(f"chromium dumped no DOM for {url} (exit {done.returncode}): {detail}")
    return Page(html, _CONSOLE.findall(done.stderr.decode(errors="replace")))


def dump_dom(
    url: str,
    width: int = 1400,
    height: int = 900,
    wait_ms: int = DEFAULT_WAIT_MS,
    timeout_s: float = 90.0,
) -> str:
    """The page's DOM as HTML after its scripts ran for wait_ms of virtual time."""
    return inspect_page(url, width, height, wait_ms, timeout_s).dom
