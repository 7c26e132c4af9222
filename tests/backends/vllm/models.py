"""The tiny model the real-vLLM tier serves, built once per machine at a path that does not change.

vLLM keys its torch.compile cache by the model's path (ModelConfig.compute_hash): a model built in
each run's temporary folder compiled anew at every run (~25 of a replica's ~70 s start on two
cores); at one path per build, a machine's second run finds the compiled graph (measured
2026-12-07: 72 s, then 45 s). The path names a digest of the builder's source, the shape and the
seed, so a change to the builder builds a new model instead of serving a stale one."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from backends import tiny_model
from backends.tiny_model import TINY, Shape, build_tiny_model


def cache_root() -> Path:
    """ZEROGAP_MODEL_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/zerogap/models."""
    if os.environ.get("ZEROGAP_MODEL_CACHE"):
        return Path(os.environ["ZEROGAP_MODEL_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "zerogap" / "models"


def model_key(shape: Shape, seed: int) -> str:
    digest = hashlib.sha256(repr((tuple(shape), seed)).encode())
    for source in sorted(Path(tiny_model.__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def cached_tiny_model(shape: Shape = TINY, seed: int = 0) -> Path:
    """The model's folder, built now if this machine has none for this builder, shape and seed.
    Built beside its final path and renamed into place, so a reader never sees half a model and
    two processes building at once both end with one whole folder."""
    root = cache_root()
    final = root / f"tiny-{model_key(shape, seed)}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=root))
    build_tiny_model(partial, seed, shape)
    try:
        partial.rename(final)
    except OSError:  # another process renamed its build into place first
        shutil.rmtree(partial, ignore_errors=True)
        if not (final / "config.json").is_file():
            raise
    return final
