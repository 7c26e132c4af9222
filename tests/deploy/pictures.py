"""Looking at rendered PNGs: how much of the picture is not background, and its colours."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image


def rgb(png: Path) -> NDArray[np.int16]:
    """The picture as a height x width x 3 array of signed ints (so differences do not wrap)."""
    with Image.open(png) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def ink_fraction(png: Path, background: tuple[int, int, int] = (255, 255, 255), tolerance: int = 16) -> float:
    """The share of pixels that differ from the background colour by more than tolerance."""
    far = np.abs(rgb(png) - np.array(background, dtype=np.int16)).max(axis=2) > tolerance
    return float(far.mean())


def count_colour(png: Path, colour: tuple[int, int, int], tolerance: int = 30) -> int:
    near = np.abs(rgb(png) - np.array(colour, dtype=np.int16)).max(axis=2) <= tolerance
    return int(near.sum())


def size(png: Path) -> tuple[int, int]:
    with Image.open(png) as image:
        width, height = image.size
        return width, height
