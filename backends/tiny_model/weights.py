"""config.json, generation_config.json and model.safetensors of a tiny random Llama,
written with numpy only (no torch in the project's environment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def model_config() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": NUM_LAYERS,
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


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor LlamaForCausalLM loads, by its Hugging Face name."""
    attn = NUM_HEADS * HEAD_DIM
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB_SIZE, HIDDEN_SIZE),
        "model.norm.weight": (HIDDEN_SIZE,),
        "lm_head.weight": (VOCAB_SIZE, HIDDEN_SIZE),
    }
    for i in range(NUM_LAYERS):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.self_attn.q_proj.weight": (attn, HIDDEN_SIZE),
            f"{layer}.self_attn.k_proj.weight": (attn, HIDDEN_SIZE),
            f"{layer}.self_attn.v_proj.weight": (attn, HIDDEN_SIZE),
            f"{layer}.self_attn.o_proj.weight": (HIDDEN_SIZE, attn),
            f"{layer}.mlp.gate_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{layer}.mlp.up_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{layer}.mlp.down_proj.weight": (HIDDEN_SIZE, INTERMEDIATE_SIZE),
            f"{layer}.input_layernorm.weight": (HIDDEN_SIZE,),
            f"{layer}.post_attention_layernorm.weight": (HIDDEN_SIZE,),
        }
    return shapes


def random_tensors(seed: int) -> dict[str, np.ndarray]:
    """Normal(0, 0.02) matrices, norms at one: the usual Llama initialisation."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes().items():
        if len(shape) == 1:
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            tensors[name] = rng.normal(0.0, INIT_STD, size=shape).astype(np.float32)
    return tensors


def write_weights(out_dir: Path, seed: int) -> None:
    (out_dir / "config.json").write_text(json.dumps(model_config(), indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
    save_file(random_tensors(seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
