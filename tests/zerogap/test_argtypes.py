"""The shared argument types: what they accept and what they tell a user who typed something else."""

from __future__ import annotations

import argparse

import pytest

from common.argtypes import both_slo_targets, slo_targets


def test_slo_targets_reads_either_or_both() -> None:
    assert slo_targets("ttft_ms=500,tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert slo_targets(" tpot_ms=40 ,") == {"tpot_ms": 40.0}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft=500", "give ttft_ms=N and/or tpot_ms=N"),
        ("ttft_ms=-1", "must be > 0"),
        ("ttft_ms=abc", "is not a number"),
    ],
)
def test_slo_targets_says_what_to_give(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        slo_targets(text)


def test_both_slo_targets_needs_both() -> None:
    assert both_slo_targets("ttft_ms=1,tpot_ms=2") == {"ttft_ms": 1.0, "tpot_ms": 2.0}
    with pytest.raises(argparse.ArgumentTypeError, match="has no tpot_ms"):
        both_slo_targets("ttft_ms=500")
