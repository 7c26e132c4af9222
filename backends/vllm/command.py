"""vLLM's command line from [engine], [scheduler] and [token_interval].

Only what config.toml sets is passed: a setting the file leaves out stays vLLM's own
default (tuned per platform), and the launcher's table says so. `asked()` is the
same mapping as data, for that table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from backends.errors import LaunchError
from common.config import Config

ENTRY = Path(__file__).with_name("entry.py")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# config.toml field -> (section, vLLM flag); booleans use --flag / --no-flag.
FLAGS: dict[str, tuple[str, str]] = {
    "dtype": ("engine", "--dtype"),
    "max_model_len": ("engine", "--max-model-len"),
    "tensor_parallel_size": ("engine", "--tensor-parallel-size"),
    "pipeline_parallel_size": ("engine", "--pipeline-parallel-size"),
    "gpu_memory_utilization": ("engine", "--gpu-memory-utilization"),
    "max_num_seqs": ("scheduler", "--max-num-seqs"),
    "max_num_batched_tokens": ("scheduler", "--max-num-batched-tokens"),
    "enable_chunked_prefill": ("scheduler", "--enable-chunked-prefill"),
    "scheduler_policy": ("scheduler", "--scheduling-policy"),
    "async_scheduling": ("token_interval", "--async-scheduling"),
    "api_server_count": ("token_interval", "--api-server-count"),
}


def resolve_model(config: Config) -> str:
    """A local folder (relative to config.toml) or a Hugging Face id; a missing folder is an error."""
    value = config.engine.model.strip()
    if not value:
        raise LaunchError(
            f"{config.source}: [engine].model is empty. Set it to a model folder or a Hugging Face id; "
            "with no GPU and no download, `zerogap tiny-model models/tiny-llama` builds one to serve."
        )
    path = config.resolve_path(value)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LaunchError(
                f"{config.source}: [engine].model {path} has no config.json, so it is not a model folder. "
                f"Point it at the folder that holds config.json, or build one: zerogap tiny-model {value}"
            )
        return str(path)
    looks_local = value.startswith((".", "/", "~")) or (config.base_dir / value.split("/")[0]).is_dir()
    if looks_local or not _HF_ID.match(value):
        raise LaunchError(
            f"{config.source}: [engine].model: {path} does not exist. Fix the path (it is relative to "
            f"the config file), or build a tiny test model there: zerogap tiny-model {value}"
        )
    return value  # a Hugging Face id: vLLM downloads it


def set_fields(config: Config, section: str) -> set[str]:
    model: Any = getattr(config, section)
    return set(model.model_fields_set)


def asked(config: Config) -> dict[str, Any]:
    """Each mapped setting the file sets, by its config.toml field name."""
    out: dict[str, Any] = {}
    for name, (section, _) in FLAGS.items():
        if name in set_fields(config, section):
            value = getattr(getattr(config, section), name)
            if value is not None:
                out[name] = value
    for name in ("overlap_token_interval", "detokenizer_async", "slot_reuse"):
        if name in set_fields(config, "token_interval"):
            out[name] = getattr(config.token_interval, name)
    return out


def _flag(flag: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag.removeprefix("--")]
    return [flag, str(value)]


def vllm_argv(config: Config, python: str, model: str, port: int) -> list[str]:
    """The full command of one replica: zerogap's entry.py runs `vllm serve MODEL ...`."""
    engine = config.engine
    argv = [python, str(ENTRY), model, "--served-model-name", engine.client_model_name()]
    argv += ["--host", engine.host, "--port", str(port)]
    for name, value in asked(config).items():
        if name in FLAGS:
            argv += _flag(FLAGS[name][1], value)
    return argv + list(engine.extra_args)


def vllm_env(config: Config) -> dict[str, str]:
    """Environment a replica adds: [engine].env, and the in-process engine core when the
    file turns detokenizer_async off (vLLM then tokenizes and schedules in one process)."""
    env = dict(config.engine.env)
    if not config.token_interval.detokenizer_async:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env
