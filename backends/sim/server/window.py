"""Recent-window statistics of the step loop: GPU busy ratio, GPU gap, CPU interval, lag."""

from __future__ import annotations

from collections import deque

import numpy as np

from backends.sim.engine.steps import StepRecord


class BusyWindow:
    """The steps of the last window_s seconds: GPU busy ratio (modelled forward time /
    wall time), the GPU's mean idle gap between two forwards, the mean CPU work per step."""

    def __init__(self, window_s: float, start_s: float) -> None:
        self.window_s = window_s
        self.start_s = start_s
        self.steps: deque[StepRecord] = deque()
        self.forward_sum = 0.0
        self.cpu_sum = 0.0
        self.gap_sum = 0.0
        self.num_gaps = 0

    def add(self, step: StepRecord) -> None:
        self.steps.append(step)
        self.forward_sum += step.forward_s
        self.cpu_sum += step.cpu_s
        if step.gap_s is not None:
            self.gap_sum += step.gap_s
            self.num_gaps += 1
        self._trim(step.end_s)

    def _trim(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        steps = self.steps
        while steps and steps[0].end_s < horizon:
            old = steps.popleft()
            self.forward_sum -= old.forward_s
            self.cpu_sum -= old.cpu_s
            if old.gap_s is not None:
                self.gap_sum -= old.gap_s
                self.num_gaps -= 1

    def busy_ratio(self, now_s: float) -> float:
        self._trim(now_s)
        span = min(self.window_s, now_s - self.start_s)
        if span <= 0 or not self.steps:
            return 0.0
        return max(0.0, min(1.0, self.forward_sum / span))

    def mean_gap_s(self, now_s: float) -> float:
        """The token interval as the GPU sees it: idle time between two forwards."""
        self._trim(now_s)
        return max(0.0, self.gap_sum / self.num_gaps) if self.num_gaps else 0.0

    def mean_cpu_s(self, now_s: float) -> float:
        """The CPU work per step, hidden behind the forward or not."""
        self._trim(now_s)
        return max(0.0, self.cpu_sum / len(self.steps)) if self.steps else 0.0


class LagRecorder:
    """Step-loop lag (actual - scheduled step start) of the last max_steps steps."""

    def __init__(self, max_steps: int = 100_000) -> None:
        self.lags_s: deque[float] = deque(maxlen=max_steps)
        self.num_steps = 0

    def record(self, lag_s: float) -> None:
        self.lags_s.append(lag_s)
        self.num_steps += 1

    def reset(self) -> None:
        self.lags_s.clear()

    def summary_ms(self) -> dict[str, float | int]:
        if not self.lags_s:
            return {"num_steps": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
        lags = np.asarray(self.lags_s) * 1000.0
        p50, p90, p99 = np.percentile(lags, [50, 90, 99])
        return {
            "num_steps": len(lags),
            "p50": float(p50),
            "p90": float(p90),
            "p99": float(p99),
            "max": float(lags.max()),
            "mean": float(lags.mean()),
        }
