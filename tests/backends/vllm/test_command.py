"""config.toml -> vLLM's command line and environment; model path checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backends.errors import LaunchError
from backends.tiny_model import build_tiny_model
from backends.vllm.command import ENTRY, asked, resolve_model, vllm_argv, vllm_env
from common.config import parse_config


def config(text: str, base: Path):
    return parse_config(text, "c.toml", env={}, base_dir=base)


def test_only_what_the_file_sets_is_passed(tmp_path) -> None:
    c = config('[engine]\nmodel = "m"\nmax_model_len = 1024\n[scheduler]\nmax_num_seqs = 64\n', tmp_path)
    argv = vllm_argv(c, "/py", "/abs/m", 8105)
    assert argv[:3] == ["/py", str(ENTRY), "/abs/m"]
    assert argv[argv.index("--served-model-name") + 1] == "m"
    assert argv[argv.index("--port") + 1] == "8105"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    for left_to_vllm in ("--max-num-batched-tokens", "--async-scheduling", "--dtype", "--gpu-memory-utilization"):
        assert left_to_vllm not in argv


def test_every_mapped_setting_and_booleans(tmp_path) -> None:
    c = config(
        """
[engine]
model = "m"
served_model_name = "tiny"
tensor_parallel_size = 2
pipeline_parallel_size = 1
dtype = "float32"
gpu_memory_utilization = 0.85
extra_args = ["--enforce-eager"]
[scheduler]
max_num_batched_tokens = 4096
enable_chunked_prefill = false
scheduler_policy = "priority"
[token_interval]
async_scheduling = false
api_server_count = 2
slot_reuse = true
""",
        tmp_path,
    )
    argv = vllm_argv(c, "/py", "m", 8100)
    text = " ".join(argv)
    for expected in (
        "--served-model-name tiny",
        "--tensor-parallel-size 2",
        "--pipeline-parallel-size 1",
        "--dtype float32",
        "--gpu-memory-utilization 0.85",
        "--max-num-batched-tokens 4096",
        "--no-enable-chunked-prefill",
        "--scheduling-policy priority",
        "--no-async-scheduling",
        "--api-server-count 2",
    ):
        assert expected in text
    assert argv[-1] == "--enforce-eager"
    assert asked(c)["slot_reuse"] is True  # no flag: V1 always does it; the table reports it


def test_detokenizer_in_process_sets_vllms_switch(tmp_path) -> None:
    c = config('[engine]\nmodel = "m"\nenv = { A = "1" }\n[token_interval]\ndetokenizer_async = false\n', tmp_path)
    assert vllm_env(c) == {"A": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert vllm_env(config('[engine]\nmodel = "m"\n', tmp_path)) == {}


def test_local_model_resolved_relative_to_the_config(tmp_path) -> None:
    build_tiny_model(tmp_path / "models" / "tiny")
    c = config('[engine]\nmodel = "models/tiny"\n', tmp_path)
    assert resolve_model(c) == str(tmp_path / "models" / "tiny")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("", "[engine].model is empty"),
        ("models/tiny-llama", "does not exist"),
        ("./here", "does not exist"),
        ("/no/such/dir", "does not exist"),
    ],
)
def test_missing_model_path_says_what_to_do(tmp_path, model: str, says: str) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(LaunchError) as info:
        resolve_model(config(f'[engine]\nmodel = "{model}"\n', tmp_path))
    assert says in str(info.value)
    assert "zerogap tiny-model" in str(info.value)


def test_folder_without_config_json(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(LaunchError, match=r"has no config\.json"):
        resolve_model(config('[engine]\nmodel = "m"\n', tmp_path))


def test_hugging_face_id_goes_to_vllm(tmp_path) -> None:
    assert resolve_model(config('[engine]\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\n', tmp_path)) == (
        "Qwen/Qwen2.5-0.5B-Instruct"
    )


def test_entry_runs_without_zerogap_on_the_path() -> None:
    """entry.py runs under vLLM's interpreter: it may import only the standard library."""
    source = ENTRY.read_text()
    assert "zerogap" not in source.split('"""', 2)[2].replace("ZEROGAP_VLLM_CONFIG", "")
    assert sys.executable  # the module imports cleanly here too (startup_report reads its MARK)
