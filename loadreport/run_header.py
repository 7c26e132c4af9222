"""The top of a run's report.html: what was run, against what, and how it ended, in
sentences for a person (report.json's "run" holds the same facts as fields)."""

from __future__ import annotations

import html
from typing import Any

MODES = {
    "closed_loop": "closed loop: each user sends its next request when its last one ends",
    "open_loop": "open loop: requests arrive at a set rate, whether or not earlier ones have ended",
}
PROMPT_SOURCES = {
    "tokenize": "prompt lengths confirmed by the server's tokenizer (/tokenize)",
    "approx": "prompt lengths approximated (one word per token; no /tokenize answered)",
}
KNOWN = {
    "name",
    "started_utc",
    "started_unix_s",
    "ended_utc",
    "duration_s",
    "base_url",
    "model",
    "stopped_early",
    "endpoint",
    "mode",
    "prompt_tokens_from",
    "num_worker_processes",
    "interrupted_requests",
}


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _when(run: dict[str, Any]) -> str | None:
    if run.get("started_utc") is None:
        return None
    text = f"Started {run['started_utc']}"
    if run.get("duration_s") is not None:
        text += f", ran {run['duration_s']:g} s"
    if run.get("ended_utc") is not None:
        text += f" (ended {run['ended_utc']})"
    return text + "."


def _target(run: dict[str, Any]) -> str | None:
    where = "".join(str(run[k]) for k in ("base_url", "endpoint") if run.get(k) is not None)
    if not where and run.get("model") is None:
        return None
    model = f"model {run['model']}" if run.get("model") is not None else "the server's model"
    return f"Target: {model}" + (f" at {where}" if where else "") + "."


def _how(run: dict[str, Any]) -> str | None:
    parts = []
    if run.get("mode") is not None:
        parts.append(MODES.get(str(run["mode"]), str(run["mode"]).replace("_", " ")))
    if run.get("num_worker_processes") is not None:
        parts.append(_plural(int(run["num_worker_processes"]), "load-generator process", "load-generator processes"))
    source = run.get("prompt_tokens_from")
    if source is not None:
        parts.append(PROMPT_SOURCES.get(str(source), f"prompt lengths from {source}"))
    return ("Load: " + "; ".join(parts) + ".") if parts else None


def _ending(run: dict[str, Any]) -> list[str]:
    out = []
    if run.get("stopped_early") is not None:
        out.append(f"Stopped early: {run['stopped_early']}. The steps after that point were not run.")
    interrupted = run.get("interrupted_requests")
    if interrupted:
        were = "was" if interrupted == 1 else "were"
        out.append(
            f"{_plural(int(interrupted), 'request', 'requests')} {were} still streaming when the test stopped "
            "(the load generator cut them off at the end, not the server): they count neither as successes "
            "nor as failures."
        )
    return out


def _plain(value: Any) -> bool:
    return value is not None and not isinstance(value, dict | list)


def _label(key: str) -> str:
    return key.replace("_", " ")


def run_sentences(run: dict[str, Any]) -> list[str]:
    """The run's facts as sentences; a field that is None (or unknown and not a plain value) is left out."""
    out = [text for text in (_when(run), _target(run), _how(run)) if text]
    out += _ending(run)
    extra = [f"{_label(k)}: {v}" for k, v in run.items() if k not in KNOWN and _plain(v)]
    if extra:
        out.append("Also: " + "; ".join(extra) + ".")
    return out


def run_header(report: dict[str, Any]) -> str:
    """HTML paragraphs for the top of report.html."""
    return "\n".join(f"<p class=note>{html.escape(text)}</p>" for text in run_sentences(report.get("run") or {}))
