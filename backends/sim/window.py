"""Recent-window statistics of the step loop: GPU busy ratio, token interval, lag."""

from __future__ import annotations

from collections import deque

import numpy as np


class BusyWindow:
    """Modelled forward time / wall time over the last window_s seconds."""

    def __init__(self, window_s: float, start_s: float) -> None:
        self.window_s = window_s
        self.start_s = start_s
        self.steps: deque[tuple[float, float, float]] = deque()  # (end_s, forward_s, interval_s)
        self.forward_sum = 0.0
        self.interval_sum = 0.0

    def add(self, end_s: float, forward_s: float, interval_s: float) -> None:
        self.steps.append((end_s, forward_s, interval_s))
        self.forward_sum += forward_s
        self.interval_sum += interval_s
        self._trim(end_s)

    def _trim(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        steps = self.steps
        while steps and steps[0][0] < horizon:
            _, forward, interval = steps.popleft()
            self.forward_sum -= forward
            self.interval_sum -= interval

    def busy_ratio(self, now_s: float) -> float:
        self._trim(now_s)
        span = min(self.window_s, now_s - self.start_s)
        if span <= 0 or not self.steps:
            return 0.0
        return max(0.0, min(1.0, self.forward_sum / span))

    def mean_interval_s(self, now_s: float) -> float:
        self._trim(now_s)
        return self.interval_sum / len(self.steps) if self.steps else 0.0


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
