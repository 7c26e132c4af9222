"""The tiny model's files are valid without vLLM: shapes, tokenizer, determinism, CLI.
(tests/backends/vllm/test_real_vllm.py checks that vLLM actually serves them.)"""

from __future__ import annotations

import json
import math
import subprocess

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from backends.tiny_model import FILES, HEAVY, build_tiny_model, main
from backends.tiny_model.weights import model_config, tensor_shapes
from tests.support import zerogap_cmd


def test_files_are_a_llama_vllm_can_load(tmp_path) -> None:
    out = build_tiny_model(tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"] == 128
    assert config["head_dim"] == 64  # 16 fails on vLLM's CPU attention
    tensors = load_file(str(out / "model.safetensors"))
    assert {name: t.shape for name, t in tensors.items()} == tensor_shapes()
    assert all(str(t.dtype) == "float32" for t in tensors.values())
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], config["hidden_size"])


def test_the_heavy_shape_is_a_consistent_llama_of_about_100m_parameters() -> None:
    """The HEAVY shape (tests whose premise is an engine-bound vLLM): its config and its tensors
    agree, and its size is what makes a CPU step cost tens of milliseconds (not built here: 400 MB)."""
    config, shapes = model_config(HEAVY), tensor_shapes(HEAVY)
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"] == 1024
    assert config["num_hidden_layers"] == 8
    assert shapes["model.layers.7.mlp.down_proj.weight"] == (1024, config["intermediate_size"])
    assert "model.layers.8.mlp.down_proj.weight" not in shapes
    num_params = sum(math.prod(dims) for dims in shapes.values())
    assert 90e6 < num_params < 110e6, num_params


def test_tokenizer_round_trips_and_matches_the_config(tmp_path) -> None:
    out = build_tiny_model(tmp_path)
    config = json.loads((out / "config.json").read_text())
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    assert tokenizer.token_to_id(tok_config["bos_token"]) == config["bos_token_id"]
    assert tokenizer.token_to_id(tok_config["eos_token"]) == config["eos_token_id"]
    text = "Hello, GPU world: 12345 tokens per second! ünïcödé"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == config["bos_token_id"]
    assert tokenizer.decode(encoding.ids) == text
    assert len(encoding.ids) < len(text.encode())  # BPE merged something
    assert "messages" in tok_config["chat_template"] and "add_generation_prompt" in tok_config["chat_template"]


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path) -> None:
    a, b, c = build_tiny_model(tmp_path / "a"), build_tiny_model(tmp_path / "b"), build_tiny_model(tmp_path / "c", 1)
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_cli_refuses_to_overwrite_without_force(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "m")]) == 0
    assert main([str(tmp_path / "m")]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([str(tmp_path / "m"), "--force", "--seed", "3"]) == 0


def test_cli_on_a_file_says_so(tmp_path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = subprocess.run(zerogap_cmd("tiny-model", str(target)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "is a file, not a folder" in result.stderr
    assert "Traceback" not in result.stderr
