from __future__ import annotations

import subprocess

from tests.support import zerogap_cmd
from zerogap.cli import COMMANDS, main


def test_help_lists_every_command(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_an_error(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_console_script_runs() -> None:
    result = subprocess.run(zerogap_cmd("--version"), capture_output=True, text=True, check=True)
    assert result.stdout.startswith("zerogap ")
