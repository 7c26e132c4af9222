"""config.json, generation_config.json and model.safetensors of a tiny random Llama,
written with numpy only (no torch in the project's environment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors.numpy import save_file

# The smallest shape vLLM's CPU attention accepts: head_dim 16 fails there
# ("Unsupported CPU attention configuration"); 64 works.
HIDDEN_SIZE = 128
NUM_HEADS = 2
HEAD_DIM = 64
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
VOCAB_SIZE = 512
MAX_POSITIONS = 4096
BOS_ID = 1
EOS_ID = 2
INIT_STD = 0.02


class Shape(NamedTuple):
    """The model's size. TINY is the default: its engine step is well under a millisecond on a CPU,
    so vLLM's API server, not its engine, is what a load test meets first. HEAVY is ~100M
    parameters: a step costs tens of milliseconds on a CPU, so the engine is the bottleneck (tests
    whose premise is an engine-held queue)."""

    hidden_size: int = HIDDEN_SIZE
    num_heads: int = NUM_HEADS
    num_layers: int = NUM_LAYERS
    intermediate_size: int = INTERMEDIATE_SIZE


TINY = Shape()
HEAVY = Shape(hidden_size=1024, num_heads=16, num_layers=8, intermediate_size=2816)


def model_config(shape: Shape = TINY) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_heads,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": shape.num_layers,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
    }


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}


def tensor_shapes(shape: Shape = TINY) -> dict[str, tuple[int, ...]]:
    """Every tensor LlamaForCausalLM loads, by its Hugging Face name."""
    attn = shape.num_heads * HEAD_DIM
    hidden, inner = shape.hidden_size, shape.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB_SIZE, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (VOCAB_SIZE, hidden),
    }
    for i in range(shape.num_layers):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.self_attn.q_proj.weight": (attn, hidden),
            f"{layer}.self_attn.k_proj.weight": (attn, hidden),
            f"{layer}.self_attn.v_proj.weight": (attn, hidden),
            f"{layer}.self_attn.o_proj.weight": (hidden, attn),
            f"{layer}.mlp.gate_proj.weight": (inner, hidden),
            f"{layer}.mlp.up_proj.weight": (inner, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inner),
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.post_attention_layernorm.weight": (hidden,),
        }
    return shapes


def random_tensors(seed: int, shape: Shape = TINY) -> dict[str, np.ndarray]:
    """Normal(0, 0.02) matrices, norms at one: the usual Llama initialisation."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, dims in tensor_shapes(shape).items():
        if len(dims) == 1:
            tensors[name] = np.ones(dims, dtype=np.float32)
        else:
            tensors[name] = rng.normal(0.0, INIT_STD, size=dims).astype(np.float32)
    return tensors


def write_weights(out_dir: Path, seed: int, shape: Shape = TINY) -> None:
    (out_dir / "config.json").write_text(json.dumps(model_config(shape), indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
    save_file(random_tensors(seed, shape), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
