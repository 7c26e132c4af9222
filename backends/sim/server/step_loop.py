"""The real-time step loop on asyncio.

Each step is scheduled at its start (core.next_step(): the batch and its modelled
cost), then the loop sleeps until the modelled end of the step and applies it: the
step is recorded (steps.py: where its forward sat, the GPU's gap since the last one,
its CPU work) and its tokens go to their requests' sinks. The next step is scheduled
from the modelled boundary (no drift), so the step-loop lag (actual minus scheduled
step start) measures whether this process keeps up. With an API server modelled ([sim]
frontend_*), requests and tokens pass through it (outbox.py) on their way in and out.
"""

from __future__ import annotations

import asyncio
import time

from backends.sim.engine.core import EngineCore, ScheduledStep
from backends.sim.engine.frontend import Frontend
from backends.sim.engine.scheduler import TokenEvent
from backends.sim.engine.sequence import Sequence
from backends.sim.engine.steps import StepTimeline
from backends.sim.server.gcwatch import GcWatch
from backends.sim.server.kv_publisher import KvEventPublisher
from backends.sim.server.metrics import SimMetrics
from backends.sim.server.outbox import Outbox
from backends.sim.server.stream import TokenSink
from backends.sim.server.window import BusyWindow, LagRecorder
from backends.sim.settings import SimSettings

now_s = time.monotonic


class RealtimeEngine:
    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.core = EngineCore(settings)
        self.sinks: dict[int, TokenSink] = {}
        self.window = BusyWindow(settings.cost.metrics_window_s, now_s())
        self.timeline = StepTimeline()
        self.lag = LagRecorder()
        self.work = LagRecorder()  # CPU time of the step loop itself per step (apply + schedule the next)
        self.gc = GcWatch()
        self.metrics = SimMetrics(settings.model, self.core, self.window)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.kv_publisher: KvEventPublisher | None = None  # [sim] kv_events_endpoint: the cache's changes
        frontend = Frontend.of(settings)
        self.outbox = None if frontend is None else Outbox(frontend, now_s, self.abort)

    def start(self) -> None:
        self.gc.__enter__()
        if self.settings.cost.kv_events_endpoint is not None:
            self.kv_publisher = KvEventPublisher(self.settings.cost)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-step-loop")

    async def stop(self) -> None:
        self.gc.__exit__()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.outbox is not None:
            self.outbox.close()
        for sink in self.sinks.values():
            sink.close("abort")
        self.sinks.clear()
        if self.kv_publisher is not None:
            await self.kv_publisher.close()
            self.kv_publisher = None

    def submit(self, seq: Sequence) -> TokenSink:
        sink = TokenSink(seq)
        self.sinks[seq.seq_id] = sink
        if self.outbox is None:
            self._enter(seq)
        else:
            self.outbox.admit(seq, self._enter)
        return sink

    def _enter(self, seq: Sequence) -> None:
        self.core.add(seq)
        self._wakeup.set()

    def abort(self, seq: Sequence) -> None:
        """The client went away: free the slot and the blocks now."""
        if self.outbox is not None and self.outbox.drop(seq):
            self.metrics.on_abort()  # still at the API server: the engine never saw it
        elif not seq.finished:
            self.core.abort(seq)
            self.metrics.on_abort()
        sink = self.sinks.pop(seq.seq_id, None)
        if sink is not None:
            sink.close("abort")
        self._wakeup.set()

    async def _run(self) -> None:
        while True:
            scheduled = self.core.next_step()
            if scheduled is None:
                self.timeline.idle()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            target = now_s()
            while scheduled is not None:
                start = target
                target += scheduled.cost.duration_s
                await _sleep_until(target)
                actual = now_s()
                self.lag.record(actual - target)
                self._apply(scheduled, start, actual)
                scheduled = self.core.next_step()
                self.work.record(now_s() - actual)

    def _apply(self, scheduled: ScheduledStep, start_s: float, t: float) -> None:
        """The step that began at start_s (a modelled boundary) has ended: record it and
        hand its tokens out (at t, the time it really is)."""
        events = self.core.finish(scheduled)
        batch = scheduled.batch
        step = self.timeline.record(start_s, scheduled.cost, batch.num_seqs, batch.num_tokens, len(events))
        self.window.add(step)
        self.metrics.on_step(step)
        self._deliver(events, t)
        if self.kv_publisher is not None:
            self.kv_publisher.publish(self.core.blocks.take_events())

    def _deliver(self, events: list[TokenEvent], t: float) -> None:
        """Hand each token to its request (usually: write it to the socket). Inter-token
        latencies are grouped by the previous token's time: in a steady batch they are
        all the same, so the histogram is updated once per distinct value."""
        sinks = self.sinks
        metrics = self.metrics
        outbox = self.outbox
        previous: dict[float, int] = {}
        for seq, token, finished in events:
            sink = sinks.get(seq.seq_id)
            if sink is None:
                continue
            if sink.first_token_s is None:
                sink.first_token_s = t
                metrics.on_first_token(t - seq.arrival_s, len(seq.prompt_token_ids))
            else:
                last = sink.last_token_s
                previous[last] = previous.get(last, 0) + 1
            sink.last_token_s = t
            reason = None
            if finished:
                del sinks[seq.seq_id]
                reason = seq.finish_reason or "stop"
                metrics.on_finish(t - seq.arrival_s, reason)
            if outbox is not None:
                outbox.send(sink, token, reason, t)  # the client has it when the API server is done with it
            elif not sink.push(token, reason):
                self.abort(seq)
        for last, count in previous.items():
            metrics.itl.observe(t - last, count)


# The event loop's timers have millisecond resolution (uvloop, and epoll under asyncio):
# sleep on the loop until just before the step end, then the last moment in the kernel.
FINE_SLEEP_S = 0.0015


async def _sleep_until(target_s: float) -> None:
    delay = target_s - now_s()
    if delay > FINE_SLEEP_S:
        await asyncio.sleep(delay - FINE_SLEEP_S)
    else:
        await asyncio.sleep(0)  # let I/O run between back-to-back steps
    _block_until(target_s)


def _block_until(target_s: float) -> None:
    """At most FINE_SLEEP_S of blocking sleep: sub-millisecond step starts."""
    remaining = target_s - now_s()
    if remaining > 0:
        time.sleep(remaining)
