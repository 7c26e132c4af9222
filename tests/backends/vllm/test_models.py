"""The real-vLLM tier's tiny model: built once per builder, shape and seed, at a path that lasts."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backends.tiny_model import FILES, TINY, Shape
from tests.backends.vllm import models
from tests.backends.vllm.models import cached_tiny_model


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZEROGAP_MODEL_CACHE", str(tmp_path / "models"))
    return tmp_path / "models"


def test_the_second_call_serves_the_first_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[Path] = []
    real = models.build_tiny_model

    def counted(out_dir: Path, seed: int = 0, shape: Shape = TINY) -> Path:
        builds.append(out_dir)
        return real(out_dir, seed, shape)

    monkeypatch.setattr(models, "build_tiny_model", counted)
    first = cached_tiny_model()
    assert sorted(p.name for p in first.iterdir()) == sorted(FILES)
    assert cached_tiny_model() == first
    assert len(builds) == 1, "the model was built again"
    assert [p.name for p in cache.iterdir()] == [first.name], "a partial build was left behind"


def test_another_seed_or_shape_is_another_model() -> None:
    paths = {cached_tiny_model(), cached_tiny_model(seed=1), cached_tiny_model(TINY._replace(num_layers=1))}
    assert len(paths) == 3


def test_a_change_to_the_builder_is_a_new_path(monkeypatch: pytest.MonkeyPatch) -> None:
    before = models.model_key(TINY, 0)
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b"#" if self.name == "weights.py" else b""))
    assert models.model_key(TINY, 0) != before


def test_builds_at_once_end_with_one_whole_model(cache: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: cached_tiny_model(), range(4)))
    (path,) = paths
    assert sorted(p.name for p in path.iterdir()) == sorted(FILES)
    assert [p.name for p in cache.iterdir()] == [path.name]
    assert not any(p.name.endswith(".partial") for p in cache.iterdir())
    assert os.access(path / "config.json", os.R_OK)
