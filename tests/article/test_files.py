"""The article's config.toml and settings.json, verbatim: every key is understood and means
what the article says; a disagreement or an impossible request says what to do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common.config import ConfigError, load_config, parse_config
from common.net import free_port
from loadreport.schedule import LoadSchedule
from loadreport.settings import parse_settings
from tests.article.stack import ARTICLE, article_config
from tests.support import zerogap_cmd


def test_the_articles_config_toml_is_valid_as_written() -> None:
    config = load_config(ARTICLE / "config.toml", env={"TAOTOKEN_API_KEY": "sk-article-test-key-01"})
    assert config.engine.tensor_parallel_size == 4
    assert config.token_interval.overlap_token_interval is True and config.token_interval.async_scheduling is True
    logs = config.logging
    assert logs.log_tps and logs.log_gpu_util and logs.log_interval_s == 10


def test_overlap_token_interval_is_async_scheduling() -> None:
    alone = parse_config("[token_interval]\noverlap_token_interval = false\n", env={})
    assert alone.token_interval.async_scheduling is False
    with pytest.raises(ConfigError) as caught:
        parse_config("[token_interval]\nasync_scheduling = false\noverlap_token_interval = true\n", env={})
    message = str(caught.value)
    assert "overlap_token_interval = true and async_scheduling = false disagree" in message


def test_the_articles_settings_json_is_valid_as_written() -> None:
    settings = parse_settings((ARTICLE / "settings.json").read_text(encoding="utf-8"))
    assert settings.api.max_retries == 3 and settings.workload.prompt_tokens == 512 and settings.workload.stream
    assert settings.workload.model == ""  # the article names none: GET /v1/models decides
    metrics = settings.metrics
    assert metrics.collect_tps and metrics.collect_ttft and metrics.collect_tpot and metrics.collect_gpu_util
    plan = LoadSchedule.from_settings(settings.load_test)  # no steps: 30 s warm-up, then 300 s at 128 users
    assert [(p.index, p.load, p.start_s, p.end_s, p.measure_start_s) for p in plan.phases] == [
        (-1, 128, 0, 30, 30),
        (0, 128, 30, 330, 30),
    ]


def test_input_tokens_is_an_alias_of_prompt_tokens() -> None:
    assert parse_settings('{"workload": {"input_tokens": 64}}').workload.prompt_tokens == 64
    with pytest.raises(Exception, match="input_tokens"):
        parse_settings('{"workload": {"input_tokens": 64, "prompt_tokens": 64}}')


def test_vllm_with_tensor_parallel_4_and_no_gpu_says_so(tmp_path: Path, clean_env: dict[str, str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(article_config(free_port(), free_port()), encoding="utf-8")
    env = {**clean_env, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(zerogap_cmd("backends", "up", "--engine", "vllm", "--config", str(config)), cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "tensor_parallel_size × pipeline_parallel_size = 4 needs 4 GPUs per replica" in done.stderr
    assert "--engine sim" in done.stderr and "Traceback" not in done.stderr


def test_a_key_named_as_a_variable_reference_is_read_from_the_environment() -> None:
    settings = parse_settings('{"api": {"api_key": "${MY_KEY}"}}')
    assert settings.api.api_key_env == "MY_KEY" and settings.api_key({"MY_KEY": "sk-1"}) == "sk-1"
    with pytest.raises(Exception, match="api_key must not be written"):
        parse_settings('{"api": {"api_key": "sk-123"}}')
