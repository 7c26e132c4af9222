"""GPUs for each replica: replica i gets the i-th run of tensor_parallel_size ×
pipeline_parallel_size devices, through CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from collections.abc import Mapping

from backends.errors import LaunchError


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPU ids replicas may use: CUDA_VISIBLE_DEVICES if set, else every GPU NVML sees
    (none on a machine without NVIDIA's driver: vLLM then runs on its CPU backend)."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPU
        return []


def split_gpus(gpus: list[str], num_replicas: int, per_replica: int) -> list[list[str]]:
    """[] for every replica when there is no GPU (vLLM's CPU backend, one device per replica);
    else consecutive groups of per_replica."""
    if not gpus and per_replica > 1:
        raise LaunchError(
            f"tensor_parallel_size × pipeline_parallel_size = {per_replica} needs {per_replica} GPUs per replica, "
            "but this machine has no GPU visible (NVML finds none, or CUDA_VISIBLE_DEVICES is empty). "
            "On a machine without GPUs run `zerogap backends up --engine sim` (the simulated engine), or set "
            "[engine].tensor_parallel_size = 1 and pipeline_parallel_size = 1 for vLLM's CPU backend."
        )
    if not gpus:
        return [[] for _ in range(num_replicas)]
    needed = num_replicas * per_replica
    if needed > len(gpus):
        raise LaunchError(
            f"{num_replicas} replica(s) × {per_replica} GPU(s) each (tensor_parallel_size × "
            f"pipeline_parallel_size) need {needed} GPUs, but {len(gpus)} are visible ({','.join(gpus)}). "
            "Lower [engine].replicas or [engine].tensor_parallel_size, or free more GPUs."
        )
    return [gpus[i * per_replica : (i + 1) * per_replica] for i in range(num_replicas)]
