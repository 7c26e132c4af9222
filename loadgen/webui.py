"""The zerogap tab of Locust's web UI (Locust's extended web UI: extended_tabs /
extended_tables in the page's template args, the rows in /stats/requests under
extended_stats): the live per-step table the article asks to watch, one row per
step begun: users, output tok/s, TTFT p50/p99, TPOT p50, GPU utilization, failures.

    http://127.0.0.1:8089/?tab=zerogap

Locust's own request table stays requests only (one POST row): its RPS is the request rate.

The start form's users and ramp-up fields are filled from settings.json (the first step's
users, load_test.spawn_rate or, at 0 = all at once, the users per second); the steps come
from settings.json whatever the form says, and a run started with other values says so.
"""

from __future__ import annotations

import dataclasses
import json
import time
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

from locust.env import Environment

from loadreport.record import Recorder
from loadreport.schedule import LoadSchedule
from loadreport.schema import Step
from loadreport.settings import Settings
from loadreport.summary import summarize_step
from loadreport.timeline import Sample

TAB_KEY = "zerogap"
REFRESH_S = 1.0
COLUMNS = (
    ("step", "Step"),
    ("users", "Users"),
    ("output_tps", "Output tok/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("tpot_p50_ms", "TPOT p50 ms"),
    ("gpu_util", "GPU util %"),
    ("failures", "Failures"),
    ("measured", "Window"),
)
NOT_COLLECTED = "not collected"


def _cell(step: Step, name: str, value: float | None) -> float | str | None:
    """A figure's cell: "not collected" where settings.json turned it off, else rounded to 0.1."""
    if name in step.not_collected:
        return NOT_COLLECTED
    return None if value is None else round(value, 1)


def row(step: Step, num_steps: int, measured: bool) -> dict[str, Any]:
    """One step's summary (summarize_step's Step) as a row of the tab."""
    ttft, tpot, gpu = step.ttft_ms, step.tpot_ms, step.gpu_util
    return {
        "step": "warm-up" if step.index < 0 else f"{step.index + 1}/{num_steps}",
        "users": step.users,
        "output_tps": _cell(step, "output_tps", step.output_tps or 0.0),
        "ttft_p50_ms": _cell(step, "ttft_ms", None if ttft is None else ttft.p50),
        "ttft_p99_ms": _cell(step, "ttft_ms", None if ttft is None else ttft.p99),
        "tpot_p50_ms": _cell(step, "tpot_ms", None if tpot is None else tpot.p50),
        "gpu_util": _cell(step, "gpu_util", None if gpu is None else gpu.mean),
        "failures": step.requests_failed,
        "measured": "measured" if measured else "so far",
    }


def form_values(plan: LoadSchedule) -> tuple[int, float]:
    """(users, spawn rate) of the run's start: the first step's users, all at once when spawn_rate is 0."""
    users = plan.users_for(plan.phases[0])
    return users, plan.spawn_rate if plan.spawn_rate > 0 else float(max(users, 1))


def prefill_form(options: Namespace | None, plan: LoadSchedule) -> None:
    """The web UI's form (and Locust's own defaults) start at settings.json's values, not at 0 or 1."""
    if options is None:
        return
    users, spawn_rate = form_values(plan)
    if getattr(options, "num_users", None) is None:
        options.num_users = users
    if getattr(options, "spawn_rate", None) is None:
        options.spawn_rate = spawn_rate


def ignored_form_values(options: Namespace | None, plan: LoadSchedule) -> str | None:
    """What to tell a user who asked for other users, ramp-up or run time (the form, -u, -r, -t): the steps rule."""
    users, spawn_rate = form_values(plan)
    asked_users = getattr(options, "num_users", None)
    asked_rate = getattr(options, "spawn_rate", None)
    asked_time_s = getattr(options, "run_time", None)
    if asked_users in (None, users) and asked_rate in (None, spawn_rate) and not asked_time_s:
        return None
    return (
        f"the run follows settings.json's steps (the first: {users} users, ramp-up {spawn_rate:g}/s; "
        f"{plan.total_s:g} s in all), not the users ({asked_users}), ramp-up ({asked_rate}) or run time "
        f"({asked_time_s}) asked for: change load_test.steps, load_test.spawn_rate or step_duration_seconds"
    )


def live_rows(
    settings: Settings,
    plan: LoadSchedule,
    run_start: float,
    recorder: Recorder,
    samples: list[Sample],
    final: Mapping[int, Step] | None = None,
) -> list[dict[str, Any]]:
    """Each phase begun: over its measured window once that began, else over the phase so far; a step
    whose final line was printed shows that line's figures (final: index -> step)."""
    now, rows, final = time.time(), [], final or {}
    for phase in plan.phases:
        if run_start + phase.start_s > now:
            break
        measured = phase.measured and run_start + phase.measure_start_s < now  # the warm-up is never measured
        window = phase if measured else dataclasses.replace(phase, measure_start_s=phase.start_s)
        step = final.get(phase.index) or summarize_step(settings, plan, window, run_start, now, recorder, samples)
        if step is not None:
            rows.append(row(step, len(plan.steps), measured))
    return rows


class ZerogapTab:
    """Installs the tab on a Locust web UI; `rows()` gives the live table (cached REFRESH_S)."""

    def __init__(self, rows: Callable[[], list[dict[str, Any]]]) -> None:
        self.rows = rows
        self._cache: list[dict[str, Any]] = []
        self._cached_at = 0.0

    def current(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._cached_at >= REFRESH_S:
            self._cache, self._cached_at = self.rows(), now
        return self._cache

    def install(self, environment: Environment) -> None:
        web_ui = environment.web_ui
        if web_ui is None or web_ui.app is None:
            return
        app = web_ui.app
        web_ui.template_args["extended_tabs"] = [{"title": "zerogap", "key": TAB_KEY}]
        web_ui.template_args["extended_tables"] = [
            {"key": TAB_KEY, "structure": [{"key": key, "title": title} for key, title in COLUMNS]}
        ]
        from flask import Response, request

        @app.after_request
        def _add_zerogap_rows(response: Response) -> Response:
            if request.path != "/stats/requests" or response.json is None:
                return response
            extended = [{"key": TAB_KEY, "data": self.current()}]
            response.set_data(json.dumps({**response.json, "extended_stats": extended}))
            return response
