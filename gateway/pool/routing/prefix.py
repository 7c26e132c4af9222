"""The prompt's leading blocks as chained hashes: what cache-aware routing matches on.

The prompt is serialized in the order the engine sees it (tool definitions, then each
chat message's role and text; for /v1/completions the prompt string), cut into blocks
of a fixed number of characters, and each block's hash covers its own characters and
the hash of the block before it, so equal hashes at position k mean equal first k blocks
(as vLLM's block hashes do for tokens). Only full blocks count; the partial last block,
usually the part that differs, is left out. These hashes are Python's (seeded per process):
each gateway process keeps its own tables (cache_aware_local).

`Prompt.key(n)` is the other kind: one stable 64-bit hash (BLAKE2b) of the first n full
blocks' text, the same in every process and pod (cache_aware's rendezvous hashing).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

MESSAGE_END = "\x1e"  # record separator: ends each message, so "a"+"bc" differs from "ab"+"c"
ROLE_END = "\x1f"


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, sort_keys=True))
        return "\n".join(parts)
    return json.dumps(content, sort_keys=True)


def prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The prompt as one string, in the order the engine reads it."""
    if not chat:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else json.dumps(prompt)
    pieces = []
    tools = body.get("tools")
    if tools:
        pieces.append(json.dumps(tools, sort_keys=True) + MESSAGE_END)
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            pieces.append(f"{message.get('role')}{ROLE_END}{_content_text(message.get('content'))}{MESSAGE_END}")
    return "".join(pieces)


def chain_hashes(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """One hash per full leading block (at most max_blocks); hash k covers blocks 0..k."""
    num_blocks = min(len(text) // block_chars, max_blocks)
    hashes: list[int] = []
    previous = 0
    for i in range(num_blocks):
        previous = hash((previous, text[i * block_chars : (i + 1) * block_chars]))
        hashes.append(previous)
    return hashes


def prompt_blocks(body: dict[str, Any], chat: bool, block_chars: int, max_blocks: int) -> list[int]:
    return chain_hashes(prompt_text(body, chat), block_chars, max_blocks)


class Prompt:
    """A request's prompt as the prefix policies read it; each view is computed once, on demand."""

    __slots__ = ("_blocks", "block_chars", "body", "chat", "max_blocks", "text")

    def __init__(
        self, text: str, block_chars: int, max_blocks: int, body: dict[str, Any] | None = None, chat: bool = False
    ) -> None:
        self.text = text
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.body = body  # the request as parsed (kv_events tokenizes it as the engine does)
        self.chat = chat
        self._blocks: list[int] | None = None

    @classmethod
    def of(cls, body: dict[str, Any], chat: bool, block_chars: int, max_blocks: int) -> Prompt:
        return cls(prompt_text(body, chat), block_chars, max_blocks, body, chat)

    @property
    def num_blocks(self) -> int:
        return min(len(self.text) // self.block_chars, self.max_blocks)

    def blocks(self) -> list[int]:
        """The chained per-process hashes of the full leading blocks."""
        if self._blocks is None:
            self._blocks = chain_hashes(self.text, self.block_chars, self.max_blocks)
        return self._blocks

    def key(self, key_blocks: int) -> int | None:
        """A stable hash of the first min(key_blocks, num_blocks) blocks; None without a full block."""
        n = min(key_blocks, self.num_blocks)
        if n == 0:
            return None
        head = self.text[: n * self.block_chars].encode("utf-8", "surrogatepass")
        return int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "big")
