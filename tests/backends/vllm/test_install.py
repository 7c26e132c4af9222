"""Finding vLLM: a real interpreter without vLLM (this project's own) and a missing one."""

from __future__ import annotations

import sys

import pytest

from backends.errors import LaunchError
from backends.vllm.install import detect_vllm, vllm_python
from common.config import parse_config


def test_interpreter_without_vllm_points_to_setup(tmp_path) -> None:
    with pytest.raises(LaunchError) as info:
        detect_vllm(sys.executable)  # .venv has no vLLM, by design
    message = str(info.value)
    assert f"vLLM is not installed in {sys.executable}" in message
    assert "scripts/setup-vllm" in message and "pip install vllm" in message


def test_missing_interpreter(tmp_path) -> None:
    with pytest.raises(LaunchError, match="does not exist"):
        detect_vllm(str(tmp_path / "python"))


def test_interpreter_precedence() -> None:
    c = parse_config('[engine]\nmodel = "m"\n', env={})
    assert vllm_python(c, {"ZEROGAP_VLLM_PYTHON": "/v/python"}) == "/v/python"
    assert vllm_python(c, {}) == sys.executable
    c = parse_config('[engine]\nmodel = "m"\npython = "/e/python"\n', env={})
    assert vllm_python(c, {"ZEROGAP_VLLM_PYTHON": "/v/python"}) == "/e/python"
