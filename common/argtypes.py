"""Argument types the command-line parsers share: each rejects a bad value with a
message that says what to give instead (argparse prints it with the option's name)."""

from __future__ import annotations

import argparse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (a positive number), got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (a positive whole number), got {text}")
    return value


def concurrency_list(text: str) -> list[int]:
    """'32,128,256' -> [32, 128, 256]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give positive concurrencies (each >= 1), whole numbers separated by commas, e.g. 32,128,256"
        )
    return values


SLO_NAMES = ("ttft_ms", "tpot_ms")


def slo_targets(text: str) -> dict[str, float]:
    """'ttft_ms=500,tpot_ms=50' -> {"ttft_ms": 500.0, "tpot_ms": 50.0} (either may be left out)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in SLO_NAMES:
            raise argparse.ArgumentTypeError(
                f"{part!r}: give ttft_ms=N and/or tpot_ms=N (milliseconds), e.g. ttft_ms=2000,tpot_ms=100"
            )
        out[name] = positive_float(value)
    return out


def both_slo_targets(text: str) -> dict[str, float]:
    """As slo_targets, with both ttft_ms and tpot_ms required."""
    out = slo_targets(text)
    missing = [n for n in SLO_NAMES if n not in out]
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r} has no {' or '.join(missing)}: give ttft_ms=N,tpot_ms=N")
    return out
