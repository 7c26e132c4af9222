from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ConfigError, load_config, parse_config
from common.config.loader import field_path

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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[scheduler]\nmax_num_seqs = "256"',
            '[scheduler].max_num_seqs: Input should be a valid integer, not the string "256". '
            "Write max_num_seqs = 256 (no quotes).",
        ),
        (
            '[token_interval]\nasync_scheduling = "yes"',
            '[token_interval].async_scheduling: Input should be a valid boolean, not the string "yes". '
            "Write async_scheduling = true (no quotes).",
        ),
        (
            '[engine]\ngpu_memory_utilization = "0.5"',
            '[engine].gpu_memory_utilization: Input should be a valid number, not the string "0.5". '
            "Write gpu_memory_utilization = 0.5 (no quotes).",
        ),
        (
            '[gateway.cache_aware]\nbalance_rel = "2"',
            '[gateway].cache_aware.balance_rel: Input should be a valid number, not the string "2". '
            "Write balance_rel = 2 (no quotes).",
        ),
        (
            '[[backends]]\nname = "a"\nurl = "http://x:1"\nmodel = "m"\nweight = "2"',
            '[[backends]][0].weight: Input should be a valid integer, not the string "2". Write weight = 2',
        ),
        ('[sim]\ntime_scale = "4"', '[sim].time_scale: Input should be a valid number, not the string "4"'),
        ('[logging]\nlog_tps = "maybe"', 'not the string "maybe". Write true or false without quotes.'),
        ("[scheduler]\nmax_num_seqs = 256.0", "Write max_num_seqs = 256, without the decimal point."),
        ("[server]\nport = true", "[server].port: Input should be a valid integer, not true. Write a number."),
    ],
)
def test_quoted_numbers_and_booleans_are_refused_with_what_to_write(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="my.toml", env={})
    assert str(info.value).startswith("my.toml: 1 problem(s):")
    assert expected in str(info.value)


def test_an_integer_is_a_number_and_unquoted_values_load() -> None:
    config = parse_config(
        "[sim]\ntime_scale = 4\n[engine]\ngpu_memory_utilization = 1\n[token_interval]\nasync_scheduling = false",
        env={},
    )
    assert config.sim.time_scale == 4.0 and isinstance(config.sim.time_scale, float)
    assert config.engine.gpu_memory_utilization == 1.0 and config.token_interval.async_scheduling is False


def test_numbers_and_booleans_from_environment_variables_read_as_their_type() -> None:
    text = (
        '[server]\nport = "${PORT}"\napi_key = "${KEY}"\n[engine]\nenv = { SPACE = "${SPACE}" }\n'
        '[scheduler]\nmax_num_seqs = "${SEQS:-64}"\n[token_interval]\nasync_scheduling = "${ASYNC}"\n'
        '[sim]\ntime_scale = "${SCALE}"'
    )
    env = {"PORT": "9001", "KEY": "1234567890123456", "SPACE": "4", "ASYNC": "false", "SCALE": "2.5"}
    config = parse_config(text, env=env)
    assert config.server.port == 9001 and config.scheduler.max_num_seqs == 64
    assert config.server.api_key == "1234567890123456" and type(config.server.api_key) is str
    assert config.engine.env == {"SPACE": "4"} and config.token_interval.async_scheduling is False
    assert config.sim.time_scale == 2.5
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={**env, "PORT": "eighty"})
    assert '[server].port: Input should be a valid integer, but its environment variable gave "eighty"' in str(
        info.value
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[scheduler]\nmax_num_seq = 3", "[scheduler].max_num_seq: unknown key; did you mean `max_num_seqs`?"),
        ("[schedulr]\nmax_num_seqs = 3", "[schedulr]: unknown key; did you mean `scheduler`?"),
        ("[gateway.cache_aware]\nblock_char = 64", "cache_aware.block_char: unknown key; did you mean `block_chars`?"),
        ('[[backends]]\nname = "a"\nurl = "http://x:1"\nmodel = "m"\nweigth = 2', "[0].weigth: unknown key"),
        ('[[backends]]\nname = "a"\nurl = "http://x:1"\nmodel = "m"\nweigth = 2', "did you mean `weight`?"),
        ("[token_interval]\nasync_schedulng = true", "did you mean `async_scheduling`? Rename it."),
        ("[server]\nzzz = 1", "[server].zzz: unknown key. Remove it or check its spelling."),
    ],
)
def test_unknown_key_suggests_the_closest_known_one(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="my.toml", env={})
    assert expected in str(info.value)
