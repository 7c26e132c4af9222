from __future__ import annotations

from pathlib import Path

import pytest

from zerogap.config import ConfigError, load_config, parse_config
from zerogap.config.loader import field_path

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_with_key_from_env() -> None:
    config = load_config(REPO / "config.toml", env={"TAOTOKEN_API_KEY": "sk-test-unified-key-0001"})
    assert config.server.api_key == "sk-test-unified-key-0001"
    assert config.server.port == 8000
    pool = config.pool()
    assert [b.url for b in pool] == ["http://127.0.0.1:8100"]
    assert pool[0].model == "tiny-llama"


def test_missing_env_var_names_file_field_and_fix() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "config.toml", env={})
    message = str(info.value)
    assert "config.toml" in message and "[server].api_key" in message
    assert "export TAOTOKEN_API_KEY" in message


def test_missing_env_var_tolerated_when_not_strict() -> None:
    config = load_config(REPO / "config.toml", env={}, strict_env=False)
    assert config.server.api_key == ""


def test_env_default_syntax() -> None:
    config = parse_config('[server]\napi_key = "${K:-fallback-key-0000000}"', env={})
    assert config.server.api_key == "fallback-key-0000000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[server]\nport = 0", "[server].port"),
        ("[server]\nbogus = 1", "[server].bogus: unknown key"),
        ("[nosuch]\na = 1", "[nosuch]: unknown key"),
        ('[gateway]\nrouting = "random"', "[gateway].routing"),
        ('[[backends]]\nname = "a"\nurl = "not a url"\nmodel = "m"', "[[backends]][0].url"),
        ('[[backends]]\nname = "a"\nurl = "http://x:1"', "[[backends]][0].model: required"),
        ("[scheduler]\nmax_num_seqs = -1", "[scheduler].max_num_seqs"),
        ("[server\n", "not valid TOML"),
        ('[server]\napi_key = "short-key"', "[server].api_key: must be at least 16 characters (got 9); make one with"),
        ('[server]\nadmin_key = "0123456789abcde"', "[server].admin_key: must be at least 16"),
        (
            '[server]\napi_key = "0123456789abcdef"\nadmin_key = "0123456789abcdef"',
            "admin_key must differ from api_key",
        ),
        ('[server]\napi_key = "0123456789abcdef"\nmetrics_key = "0123456789abcdef"', "metrics_key must differ"),
        ("[server]\nmax_header_bytes = 10", "[server].max_header_bytes"),
        ('[gateway]\non_store_down = "maybe"', "[gateway].on_store_down"),
    ],
)
def test_bad_values_name_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="my.toml", env={})
    assert str(info.value).startswith("my.toml:")
    assert expected in str(info.value)


def test_secrets_are_not_echoed_in_config_errors() -> None:
    for text in ('[server]\napi_key = "short-Xyzzy"', '[gateway]\ndatabase_url = "mysql://u:pw-Xyzzy@h/db"'):
        with pytest.raises(ConfigError) as info:
            parse_config(text, source="my.toml", env={})
        assert "Xyzzy" not in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config("/nonexistent/config.toml")


def test_backends_listed_replace_engine_replicas() -> None:
    text = """
[engine]
model = "m"
replicas = 3
base_port = 9000
[[backends]]
name = "gpu0"
url = "http://127.0.0.1:8100/"
model = "llama"
"""
    config = parse_config(text, env={})
    assert [b.url for b in config.pool()] == ["http://127.0.0.1:8100"]
    assert [b.url for b in config.engine_replicas()] == [
        "http://127.0.0.1:9000",
        "http://127.0.0.1:9001",
        "http://127.0.0.1:9002",
    ]


def test_field_path() -> None:
    assert field_path(("server", "port")) == "[server].port"
    assert field_path(("backends", 1, "url")) == "[[backends]][1].url"
    assert field_path(()) == "(top level)"
