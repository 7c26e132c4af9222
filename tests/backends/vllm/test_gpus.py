from __future__ import annotations

import pytest

from backends.errors import LaunchError
from backends.vllm.gpus import split_gpus, visible_gpus


def test_replicas_get_consecutive_groups() -> None:
    assert split_gpus(["0", "1", "2", "3"], 2, 2) == [["0", "1"], ["2", "3"]]
    assert split_gpus(["4", "5", "6", "7"], 4, 1) == [["4"], ["5"], ["6"], ["7"]]
    assert split_gpus(["0", "1", "2"], 1, 2) == [["0", "1"]]


def test_no_gpu_means_cpu_backend_for_every_replica() -> None:
    assert split_gpus([], 3, 1) == [[], [], []]


def test_tensor_parallel_without_gpus_says_so() -> None:
    with pytest.raises(LaunchError, match=r"= 4 needs 4 GPUs per replica, but this machine has no GPU.*--engine sim"):
        split_gpus([], 1, 4)


def test_too_few_gpus_says_what_to_lower() -> None:
    with pytest.raises(LaunchError, match=r"need 4 GPUs, but 2 are visible.*tensor_parallel_size"):
        split_gpus(["0", "1"], 2, 2)


def test_cuda_visible_devices_is_respected() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
