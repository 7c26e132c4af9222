"""Several runs' (or candidates') curves in one panel, each one visible: a curve identical to an
earlier one would hide under it, so it is drawn dashed (dotted, ...) over it, thinner, with a
smaller, other marker, and its legend entry says which curve it repeats."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v")
LEGEND_CHARS = 44  # a legend entry wraps at this width, so long labels do not squeeze the panels
Curve = tuple[Sequence[float], Sequence[float]]  # x (load), y


@dataclass(frozen=True)
class CurveStyle:
    linestyle: str
    marker: str
    markersize: float
    linewidth: float
    label: str  # the legend entry
    same_as: str | None  # the label of the earlier curve this one repeats exactly


def _exact(values: Sequence[float]) -> tuple[float | None, ...]:
    return tuple(None if math.isnan(v) else float(v) for v in values)


def curve_styles(curves: Sequence[Curve], labels: Sequence[str]) -> list[CurveStyle]:
    """How each curve is drawn; the k-th repeat of a curve gets the k-th line style and marker."""
    first_of: dict[Any, str] = {}
    repeats: dict[Any, int] = {}
    out = []
    for (xs, ys), label in zip(curves, labels, strict=True):
        key = (_exact(xs), _exact(ys))
        k = repeats.get(key, 0)
        repeats[key] = k + 1
        first = first_of.setdefault(key, label)
        out.append(
            CurveStyle(
                linestyle=LINE_STYLES[k % len(LINE_STYLES)],
                marker=MARKERS[k % len(MARKERS)],
                markersize=max(7.0 - 2.0 * k, 3.0),
                linewidth=max(2.5 - 0.7 * k, 1.0),
                label=label if k == 0 else f"{label} (same as {first})",
                same_as=None if k == 0 else first,
            )
        )
    return out


def draw_curves(ax: Any, curves: Sequence[Curve], labels: Sequence[str]) -> list[CurveStyle]:
    """Plot the curves on a matplotlib Axes, one colour each (C0, C1, ...); returns their styles."""
    styles = curve_styles(curves, labels)
    for index, ((xs, ys), style) in enumerate(zip(curves, styles, strict=True)):
        ax.plot(
            list(xs), list(ys), color=f"C{index % 10}", linestyle=style.linestyle, marker=style.marker,
            markersize=style.markersize, linewidth=style.linewidth,
            label="\n".join(textwrap.wrap(style.label, LEGEND_CHARS)),
        )  # fmt: skip
    return styles
