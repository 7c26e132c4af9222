"""Failure output -> advice. CUDA OOM cannot happen on this machine (no GPU): its
mapping is tested from a captured error line; the others are also caused for real
in tests/backends/test_cli.py and test_real_vllm.py."""

from __future__ import annotations

from backends.vllm.diagnose import diagnose
from common.config import parse_config
from tests.backends.vllm.captured import CUDA_OOM_LINES, KV_TOO_SMALL_LINES, TOO_LONG_LINES

CONFIG = parse_config('[engine]\nmodel = "m"\ngpu_memory_utilization = 0.95\nmax_model_len = 32768\n', env={})


def test_cuda_oom_points_at_memory_settings() -> None:
    advice = diagnose(CUDA_OOM_LINES, CONFIG)
    assert "CUDA out of memory" in advice
    assert "gpu_memory_utilization (now 0.95)" in advice
    assert "max_model_len (now 32768)" in advice


def test_kv_cache_too_small_quotes_vllms_estimate() -> None:
    advice = diagnose(KV_TOO_SMALL_LINES, CONFIG)
    assert "Lower [engine].max_model_len (vLLM estimates 77824 fits)" in advice


def test_max_model_len_longer_than_the_model() -> None:
    advice = diagnose(TOO_LONG_LINES, CONFIG)
    assert advice.startswith("[engine].max_model_len (32768) is longer than the model allows (2048 tokens)")


def test_port_and_unknown() -> None:
    assert "in use" in diagnose(["OSError: [Errno 98] Address already in use"], CONFIG)
    assert diagnose(["something else entirely"], CONFIG) == ""
    said = diagnose(["Traceback (most recent call last):", "RuntimeError: Engine core initialization failed."], CONFIG)
    assert said == "vLLM said: RuntimeError: Engine core initialization failed."
