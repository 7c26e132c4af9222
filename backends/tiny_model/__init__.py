"""`zerogap tiny-model DIR`: a tiny random Llama and its tokenizer, built locally with
no download and no torch, in the shape vLLM's CPU build serves (see weights.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backends.tiny_model.tokenizer import write_tokenizer
from backends.tiny_model.weights import HEAVY, TINY, Shape, write_weights

__all__ = ["FILES", "HEAVY", "TINY", "Shape", "build_tiny_model"]

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def build_tiny_model(out_dir: Path, seed: int = 0, shape: Shape = TINY) -> Path:
    """Write every file of the model into out_dir (created if missing); same seed, same bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_weights(out_dir, seed, shape)
    write_tokenizer(out_dir, seed)
    return out_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap tiny-model",
        description="Build a tiny random Llama (hidden 128, 2 layers, vocab 512, float32) and a BPE "
        "tokenizer into DIR, with no download. vLLM serves it: --model DIR.",
    )
    parser.add_argument("dir", metavar="DIR", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same files")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that already holds a model")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    out_dir: Path = args.dir
    if out_dir.exists() and not out_dir.is_dir():
        print(f"zerogap tiny-model: {out_dir} is a file, not a folder. Pick another DIR.", file=sys.stderr)
        return 2
    if (out_dir / "config.json").exists() and not args.force:
        print(
            f"zerogap tiny-model: {out_dir} already holds a model (config.json). "
            "Pass --force to overwrite it, or pick another DIR.",
            file=sys.stderr,
        )
        return 2
    try:
        build_tiny_model(out_dir, args.seed)
    except OSError as exc:
        print(f"zerogap tiny-model: cannot write {out_dir}: {exc.strerror}. Pick a writable DIR.", file=sys.stderr)
        return 1
    print(f"tiny model written to {out_dir} (serve it with vLLM: --model {out_dir})")
    return 0
