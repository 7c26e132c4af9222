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
