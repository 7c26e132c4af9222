"""config.toml as typed models: every section, the loader and its errors."""

from common.config.loader import ConfigError, load_config, parse_config
from common.config.model import Config

__all__ = ["Config", "ConfigError", "load_config", "parse_config"]
