"""A candidate's result and the ranking: goodput under the SLOs, then output TPS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerogap.tune.grid import Candidate


@dataclass
class Result:
    candidate: Candidate
    steps: list[dict[str, Any]]  # report.json's steps (or their virtual-time equivalents)
    diagnosis: list[dict[str, Any]]
    elapsed_s: float = 0.0
    run_dir: str | None = None

    @property
    def best_step(self) -> dict[str, Any] | None:
        """The step with the most goodput (then output TPS): the candidate's capacity."""
        if not self.steps:
            return None
        return max(self.steps, key=lambda s: (s.get("goodput_rps") or 0.0, s.get("output_tps") or 0.0))

    @property
    def top(self) -> dict[str, Any] | None:
        """The diagnosis of the top (highest-load) step."""
        return self.diagnosis[-1] if self.diagnosis else None

    def sort_key(self) -> tuple[float, float]:
        best = self.best_step
        return (0.0, 0.0) if best is None else (best.get("goodput_rps") or 0.0, best.get("output_tps") or 0.0)

    def as_json(self) -> dict[str, Any]:
        best = self.best_step or {}
        top = self.top or {}
        return {
            "settings": self.candidate.settings,
            "label": self.candidate.label,
            "goodput_rps": best.get("goodput_rps"),
            "output_tps": best.get("output_tps"),
            "ttft_ms": best.get("ttft_ms"),
            "tpot_ms": best.get("tpot_ms"),
            "gpu_util": best.get("gpu_util"),
            "limit": top.get("limit"),
            "best_concurrency": best.get("concurrency"),
            "evidence": top.get("evidence"),
            "advice": top.get("advice"),
            "elapsed_s": round(self.elapsed_s, 2),
            "run_dir": self.run_dir,
            "steps": [
                {k: s.get(k) for k in ("concurrency", "output_tps", "goodput_rps", "gpu_util", "ttft_ms", "tpot_ms")}
                for s in self.steps
            ],
            "diagnosis": self.diagnosis,
        }


def rank(results: list[Result]) -> list[Result]:
    """Best first; ties keep the grid's order."""
    return sorted(results, key=lambda r: r.sort_key(), reverse=True)
