"""How `zerogap sim calibrate` prints a term's standard error: a percentage, flagged past 10%,
and words where the figure would say nothing (unseen, or past a factor of 100: a term the data
does not pin down can have a log error of thousands, which math.exp cannot even compute)."""

from __future__ import annotations

import math

from backends.sim.calibrate.cli import _spread


def test_a_small_error_is_a_percentage_and_not_flagged() -> None:
    assert _spread(math.log(1.05)) == "+-5.0%"


def test_the_flag_starts_past_10_percent() -> None:
    assert "loosely pinned" not in _spread(math.log(1.1) - 1e-9)
    assert _spread(math.log(1.1) + 1e-6).endswith("(loosely pinned)")


def test_an_unseen_term_and_a_huge_error_are_said_in_words() -> None:
    assert _spread(math.inf) == "not seen by the data  (loosely pinned)"
    assert _spread(1e4).startswith("over a factor of 100")  # math.exp(1e4) overflows
    assert _spread(math.log(99.0)) == "+-9800.0%  (loosely pinned)"
