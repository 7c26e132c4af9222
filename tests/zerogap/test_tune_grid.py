"""zerogap/tune/grid.py: one field named twice on the command line (by its short name and by
section.field) is refused before anything starts, not tried with the last values only."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ConfigError
from common.config.model import Config
from zerogap.tune.cli import main as tune_main
from zerogap.tune.grid import candidates, parse_axis


@pytest.mark.parametrize("second", ["max_num_seqs=128", "scheduler.max_num_seqs=128"])
def test_a_field_named_twice_is_refused_not_half_tried(
    second: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = tune_main(["--engine", "sim", "--virtual", "--grid", "max_num_seqs=16,32", "--grid", second,
                      "--out", str(tmp_path / "t")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--grid: a field is named twice" in err, err
    assert not (tmp_path / "t").exists()


def test_fields_named_once_give_every_combination() -> None:
    axes = [parse_axis("max_num_seqs=16,32"), parse_axis("token_interval.async_scheduling=false,true")]
    found = candidates(Config(), axes)
    assert [c.label for c in found] == [
        "max_num_seqs=16 async_scheduling=false",
        "max_num_seqs=16 async_scheduling=true",
        "max_num_seqs=32 async_scheduling=false",
        "max_num_seqs=32 async_scheduling=true",
    ]
    with pytest.raises(ConfigError, match="named twice"):
        candidates(Config(), [*axes, parse_axis("scheduler.max_num_seqs=64")])
