"""The capacity answer: the fewest replicas that serve N users within the SLOs.

`zerogap sim plan --users N --slo ttft_ms=..,tpot_ms=..` runs the load in virtual time on
1, 2, 3, ... replicas of the configured engine (the users split evenly, as a least-load
gateway keeps them) and stops at the first count whose TTFT p50 and TPOT p50 both meet
the SLO, up to MAX_REPLICAS. The table it decided from is printed with the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.plan.pool_predict import Load, Predicted, Window, predict
from backends.sim.settings import SimSettings

MAX_REPLICAS = 64


@dataclass(frozen=True, slots=True)
class Row:
    replicas: int
    users_per_replica: str  # "8" or "8-9"
    figures: Predicted
    meets: bool
    why: str  # what missed the SLO, "" when met


@dataclass(frozen=True, slots=True)
class Answer:
    rows: list[Row]
    replicas: int | None  # None: not met up to the bound


def check(figures: Predicted, slo: dict[str, float]) -> str:
    missed = []
    for name, value in (("TTFT p50", figures.ttft_p50_ms), ("TPOT p50", figures.tpot_p50_ms)):
        bound = slo["ttft_ms" if name.startswith("TTFT") else "tpot_ms"]
        if value is None:
            missed.append(f"{name} not measured (hold the step longer)")
        elif value > bound:
            missed.append(f"{name} {value:,.1f} > {bound:g} ms")
    return "; ".join(missed)


def fewest_replicas(
    settings: SimSettings, load: Load, slo: dict[str, float], window: Window, max_replicas: int = MAX_REPLICAS
) -> Answer:
    rows: list[Row] = []
    for replicas in range(1, min(max_replicas, load.users) + 1):
        figures = predict(settings, load, replicas, window)
        why = check(figures, slo)
        low, high = load.users // replicas, -(-load.users // replicas)
        rows.append(Row(replicas, str(low) if low == high else f"{low}-{high}", figures, not why, why))
        if not why:
            return Answer(rows, replicas)
    return Answer(rows, None)


def format_answer(answer: Answer, load: Load, slo: dict[str, float]) -> str:
    head = ("replicas", "users/replica", "output_tps", "ttft_p50_ms", "tpot_p50_ms", "gpu_busy", "slo")
    widths = (8, 13, 10, 11, 11, 8, 0)
    lines = [" ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    for row in answer.rows:
        f = row.figures
        cells = (
            str(row.replicas), row.users_per_replica, f"{f.output_tps:.0f}",
            "-" if f.ttft_p50_ms is None else f"{f.ttft_p50_ms:.1f}",
            "-" if f.tpot_p50_ms is None else f"{f.tpot_p50_ms:.2f}", f"{f.gpu_busy:.1%}",
            "met" if row.meets else f"missed: {row.why}",
        )  # fmt: skip
        lines.append(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    goal = f"{load.users} users (prompt {load.prompt_tokens}, output {load.output_tokens} tokens) within TTFT p50 <= "
    goal += f"{slo['ttft_ms']:g} ms and TPOT p50 <= {slo['tpot_ms']:g} ms"
    if answer.replicas is None:
        tried = answer.rows[-1].replicas if answer.rows else 0
        lines.append(f"answer: no replica count up to {tried} serves {goal}.")
    else:
        lines.append(f"answer: {answer.replicas} replica(s) serve {goal}.")
    return "\n".join(lines)
