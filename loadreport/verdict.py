"""What a run can and cannot tell, in sentences that hold for the steps it measured.

A knee needs two measured steps to compare; "TPS still grows" needs TPS to have grown from each
step to the next. A run that stopped before its first measured window, or measured one step,
says so instead of a verdict it has no figures for. Read from report.json's fields (the console
table, report.html and `zerogap report` print the same words).
"""

from __future__ import annotations

import itertools
from typing import Any

GROWTH = 0.10  # the knee's threshold (loadreport/run_summary.py): TPS grows less than 10% to the next step


def _load(step: dict[str, Any]) -> str:
    if step.get("request_rate") is not None:
        return f"{step['request_rate']:g} req/s"
    return f"{step['concurrency']:g} users"


def _served(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps with a TPS to compare: some output tokens arrived in their window."""
    return [step for step in steps if step.get("output_tps")]


def stop_reason(report: dict[str, Any]) -> str | None:
    """report.json's run.stopped_early, its first line (the fix follows on the next)."""
    reason = (report.get("run") or {}).get("stopped_early")
    return None if not reason else str(reason).splitlines()[0]


def _measured_nothing(report: dict[str, Any]) -> str:
    steps, reason = report["steps"], stop_reason(report)
    if reason is not None and not steps:
        why = f"No step was measured: the run stopped early ({reason}) before the first measured window"
    elif reason is not None:
        why = f"No step served a token: the run stopped early ({reason})"
    elif not steps:
        why = "No step was measured: the run ended before the first measured window"
    else:
        why = f"No step served a token ({sum(s['requests_failed'] for s in steps)} requests failed)"
    return f"{why}. It cannot tell TPS, latency, GPU utilization or where TPS stops growing; fix that and run again."


def run_verdict(report: dict[str, Any]) -> list[str]:
    """Sentences on what the run can tell, for a run that measured fewer than two steps with tokens
    (empty for a run that can be read as stepped)."""
    served = _served(report["steps"])
    if not served:
        return [_measured_nothing(report)]
    if len(served) == 1:
        return [
            f"One step was measured with tokens ({_load(served[0])}): it tells TPS and latency at that load, "
            "not how they change with load (add steps, load_test.steps, to see where TPS stops growing)."
        ]
    return []


def knee_sentence(report: dict[str, Any]) -> str:
    """The knee, or why there is none, true to the steps measured."""
    knee = report.get("knee")
    if knee:
        return f"Knee: {knee['text']}."
    served = _served(report["steps"])
    if len(served) < 2:
        return f"Knee: not known: a knee compares two steps or more, and {len(served) or 'no'} measured step" + (
            " served tokens." if len(served) == 1 else "s served tokens."
        )
    top = _load(served[-1])
    slow = [
        (here, after)
        for here, after in itertools.pairwise(served)
        if after["output_tps"] / here["output_tps"] - 1.0 < GROWTH
    ]
    if not slow:
        return (
            f"Knee: none up to {top}: TPS grew 10% or more from each of the {len(served)} steps to the next; "
            "a higher step would show where it stops."
        )
    here, after = slow[0]
    growth = (after["output_tps"] / here["output_tps"] - 1.0) * 100
    return (
        f"Knee: none found up to {top}: TPS grew {growth:.1f}% from {_load(here)} to {_load(after)}, "
        "but latency did not grow with it (more load did not only queue)."
    )


ITL_MEANING = (
    "ITL is the gap between two content events as this client read them: events that arrive in one read "
    "(sent together by the server or the network, or read late by a busy client) count as 0.0 ms gaps; "
    "TPOT, each request's (E2E - TTFT) / (tokens - 1), is the per-token pace"
)


def itl_note(report: dict[str, Any]) -> str | None:
    """Why ITL p50 reads far below TPOT p50 (often 0.0 ms), at the steps where it does; None where it does not."""
    bunched = []
    for step in report["steps"]:
        itl, tpot = step.get("itl_ms") or {}, step.get("tpot_ms") or {}
        if itl.get("p50") is not None and tpot.get("p50") and itl["p50"] < 0.5 * tpot["p50"]:
            bunched.append(f"{itl['p50']:.1f} ms at {_load(step)} (TPOT p50 {tpot['p50']:.1f} ms)")
    if not bunched:
        return None
    return f"ITL p50 {', '.join(bunched)}: {ITL_MEANING}."
