"""Garbage-collector pauses: the other thing (besides the step loop's own work) that
can delay a step. Reported by /sim/stats next to the step-loop lag."""

from __future__ import annotations

import gc
import time
from typing import Any

YOUNG_THRESHOLD = 5000


class GcWatch:
    def __init__(self) -> None:
        self._started = 0.0
        self.num_pauses = 0
        self.max_pause_s = 0.0
        self.total_pause_s = 0.0

    def __enter__(self) -> GcWatch:
        """Also move everything alive at startup (imports, the app) out of the collector's
        sight, and collect the young generation less often: full collections that walk
        the whole heap were the step loop's longest stalls (~70 ms at 1,024 streams)."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def reset(self) -> None:
        self.num_pauses, self.max_pause_s, self.total_pause_s = 0, 0.0, 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.num_pauses += 1
        self.total_pause_s += pause
        self.max_pause_s = max(self.max_pause_s, pause)

    def summary_ms(self) -> dict[str, float | int]:
        return {"num": self.num_pauses, "max": self.max_pause_s * 1000, "total": self.total_pause_s * 1000}
