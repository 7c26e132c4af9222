"""How a run ends, as the servers and the console see it.

When the plan's last step ends, each user finishes the request it is streaming and sends no
other (Locust's stop timeout, set for this stop only: at most DRAIN_MAX_S, and twice the longest
request so far plus a few seconds; or load_test.drain_seconds, where 0 cuts them, as `zerogap
tune` does: it stops the candidate's pool next), instead of cutting it: a load test that ended is then
not counted by the gateway as clients that left (its status 499) nor by the engines as aborted
requests. A request still streaming after that is cut, as before, and the report counts it
as interrupted. A stop the user asks for (Ctrl-C, the web UI's Stop, a fail-fast stop) cuts at
once; a --stop-timeout given to Locust stands as given.

A headless run's "zerogap report: PATH" line is printed last, after Locust's own summary tables.
"""

from __future__ import annotations

import time

from locust.env import Environment

from loadgen.run import Run

DRAIN_MAX_S = 30.0  # the longest the end of a run waits for its streams
DRAIN_FACTOR = 2.0  # ... else this many times the longest request seen so far (a bound: most end far sooner)
DRAIN_SLACK_S = 5.0  # ... plus this (a busy machine stretches the last requests)


def drain_seconds(run: Run, now: float) -> float:
    """How long the users may take to finish the requests they are streaming: load_test.drain_seconds
    when it is set (0: none), else the rule above."""
    if run.settings.load_test.drain_seconds is not None:
        return run.settings.load_test.drain_seconds
    longest = max((record.end - record.start for record in run.recorder.records), default=0.0)
    oldest = run.oldest_in_flight()
    if oldest is not None:
        longest = max(longest, now - oldest)
    return min(DRAIN_MAX_S, run.settings.api.timeout_seconds, DRAIN_FACTOR * longest + DRAIN_SLACK_S)


class RunEnding:
    def __init__(self, env: Environment) -> None:
        self.env = env
        self.asked_stop_timeout = float(env.stop_timeout or 0.0)  # Locust's --stop-timeout
        self.report_line: str | None = None

    @property
    def headless(self) -> bool:
        options = self.env.parsed_options
        return bool(options is not None and getattr(options, "headless", False))

    def plan_ended(self, run: Run, is_master: bool) -> None:
        """The shape's last tick: the users finish their streams (this process's, or, on a master, the
        workers': workers.py passes run.drain_s on)."""
        if run.ended_s is not None:
            return
        run.ended_s = now = time.time()
        if self.asked_stop_timeout or run.stopper.stopping:
            return
        run.drain_s = drain_seconds(run, now)
        if not is_master:
            self.env.stop_timeout = run.drain_s
            if not run.in_flight:
                return
        if not run.drain_s:  # load_test.drain_seconds 0: cut at once (Locust's stop timeout 0)
            return
        streams = "the workers' requests in flight" if is_master else f"the {len(run.in_flight)} requests in flight"
        print(
            f"zerogap: the last step has ended; {streams} may finish (at most {run.drain_s:.0f} s), "
            "so that no server counts the end of the test as clients that left",
            flush=True,
        )

    def run_stopped(self) -> None:
        """After the stop: Ctrl-C and the web UI's Stop cut at once again (a web UI may start another run)."""
        self.env.stop_timeout = self.asked_stop_timeout

    def report(self, line: str | None) -> None:
        """Where the report is: a headless run says it after Locust's summary (on quit), the web UI now."""
        if line is None:
            return
        if self.headless:
            self.report_line = line
        else:
            print(line, flush=True)

    def on_quit(self, **_: object) -> None:
        if self.report_line is not None:
            print(self.report_line, flush=True)
            self.report_line = None
