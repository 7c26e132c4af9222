"""Turn a dead replica's last output lines into a message that says what to do."""

from __future__ import annotations

import re
from collections.abc import Iterable

from common.config import Config

_MAX_LEN = re.compile(r"estimated maximum model length is (\d+)")
_DERIVED = re.compile(r"derived max_model_len \(max_position_embeddings=(\d+)")
_ERROR = re.compile(r"(\w+Error: .*|Value error, .*)")


def _oom(config: Config) -> str:
    engine = config.engine
    return (
        "the GPU ran out of memory (CUDA out of memory). Lower [engine].gpu_memory_utilization "
        f"(now {engine.gpu_memory_utilization}) if something else shares the GPU, or lower "
        f"[engine].max_model_len (now {engine.max_model_len or 'the model default'}) or "
        f"[scheduler].max_num_seqs (now {config.scheduler.max_num_seqs}); or give each replica more GPUs "
        "([engine].tensor_parallel_size)."
    )


def _kv_too_small(config: Config, text: str) -> str:
    match = _MAX_LEN.search(text)
    fit = f" (vLLM estimates {match.group(1)} fits)" if match else ""
    return (
        "the KV cache cannot hold one request of max_model_len tokens. Lower [engine].max_model_len"
        f"{fit}, or raise [engine].gpu_memory_utilization (now {config.engine.gpu_memory_utilization}); "
        "on the CPU backend raise VLLM_CPU_KVCACHE_SPACE (GiB) in [engine].env."
    )


RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED"), "oom"),
    (("larger than the available KV cache memory", "No available memory for the cache blocks"), "kv"),
    (("Address already in use", "[Errno 98]"), "port"),
    (("No module named 'vllm'", 'No module named "vllm"'), "missing"),
    (("is not a local folder and is not a valid model identifier", "Repository Not Found"), "model"),
    (("couldn't connect to 'https://huggingface.co'", "LocalEntryNotFoundError"), "model"),
    (("Unsupported CPU attention configuration",), "cpu_attn"),
    (("is greater than the derived max_model_len",), "too_long"),
)


def _message(kind: str, config: Config, text: str) -> str:
    engine = config.engine
    if kind == "oom":
        return _oom(config)
    if kind == "kv":
        return _kv_too_small(config, text)
    if kind == "port":
        return f"a port from [engine].base_port ({engine.base_port}) up is in use. Stop what holds it or change it."
    if kind == "missing":
        return "vLLM is not installed in [engine].python. Run scripts/setup-vllm, or `pip install vllm`."
    if kind == "model":
        return (
            f"vLLM cannot find the model {engine.model!r}: not a local folder, and it cannot be downloaded. "
            f"Fix [engine].model, or build a local one: zerogap tiny-model {engine.model}"
        )
    if kind == "too_long":
        match = _DERIVED.search(text)
        limit = f" ({match.group(1)} tokens)" if match else ""
        return (
            f"[engine].max_model_len ({engine.max_model_len}) is longer than the model allows{limit}. "
            "Lower it, or leave it out to use the model's own length."
        )
    return "this model's head size is not supported by vLLM's CPU attention; use head_dim 64 or more."


def last_error(lines: Iterable[str]) -> str:
    """vLLM's last error line, shortened, for failures no rule knows."""
    found = ""
    for line in lines:
        if match := _ERROR.search(line):
            found = match.group(1)
    return found[:400]


def diagnose(lines: Iterable[str], config: Config) -> str:
    """The first known failure in the output, as advice; else vLLM's last error line; else ""."""
    text = "\n".join(lines)
    for needles, kind in RULES:
        if any(needle in text for needle in needles):
            return _message(kind, config, text)
    error = last_error(text.splitlines())
    return f"vLLM said: {error}" if error else ""
