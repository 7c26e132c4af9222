"""settings.json: the shipped file loads; bad values name the field and the reason."""

from __future__ import annotations

import json

import pytest

from loadreport.settings import SettingsError, load_settings, parse_settings, settings_path
from tests.support import REPO


def test_shipped_settings_json_is_valid_and_keeps_the_articles_sections() -> None:
    settings = load_settings(REPO / "settings.json")
    raw = json.loads((REPO / "settings.json").read_text())
    assert {"api", "load_test", "workload", "metrics"} <= raw.keys()
    assert settings.load_test.steps == [32, 128, 256]
    assert (settings.load_test.step_duration_seconds, settings.load_test.measure_last_seconds) == (180, 120)
    assert settings.output.dir == "runs"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"load_test": {"steps": [32, -1]}}', "load_test.steps: steps[1] is -1.0; every step must be > 0"),
        ('{"load_test": {"steps": [1.5]}}', "with request_rate 0 a step is a user count"),
        ('{"load_test": {"concurency": 3}}', "load_test.concurency: unknown field"),
        ('{"api": {"base_url": "not a url"}}', "api.base_url:"),
        ('{"api": {"api_key": "sk-123"}}', "api_key must not be written in settings.json"),
        ('{"load_test": {"steps": [8], "measure_last_seconds": 500}}', "measure_last_seconds (500.0) is longer"),
        ('{"metrics": {"gpu_util": {"source": "dcgm"}}}', "metrics.gpu_util.source:"),
        ('{"workload": {"max_output_tokens": 0}}', "workload.max_output_tokens:"),
        ("[1, 2]", "the top level must be a JSON object"),
        ('{"api": ', "not valid JSON"),
    ],
)
def test_bad_settings_name_the_field_and_the_reason(text: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(text, "my.json")
    assert expected in str(info.value)
    assert str(info.value).startswith("my.json: ")


def test_key_comes_from_the_named_environment_variable() -> None:
    settings = parse_settings('{"api": {"api_key_env": "MY_KEY"}}')
    assert settings.api_key({"MY_KEY": "sk-secret"}) == "sk-secret"
    with pytest.raises(SettingsError, match="environment variable MY_KEY is not set"):
        settings.api_key({})
    assert parse_settings('{"api": {"api_key_env": ""}}').api_key({}) == ""


def test_settings_path_order() -> None:
    assert str(settings_path("a.json", {"ZEROGAP_SETTINGS": "b.json"})) == "a.json"
    assert str(settings_path(None, {"ZEROGAP_SETTINGS": "b.json"})) == "b.json"
    assert str(settings_path(None, {})) == "settings.json"


def test_missing_file_says_how_to_point_at_one(tmp_path) -> None:
    with pytest.raises(SettingsError, match="Pass --settings PATH"):
        load_settings(tmp_path / "absent.json")
