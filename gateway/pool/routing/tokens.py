"""The prompt's token ids as the engine computes them: what the kv_events policy matches against
the token ids of the engines' KV-cache events. `[gateway.cache_aware] tokenizer`:

- "words": the sim's tokenizer (common/sim_words.py; a chat prompt is its messages' text joined
  by spaces, as the sim reads it).
- a folder with the model's tokenizer.json (HF `tokenizers`; tokenizer_config.json's chat_template
  rendered with Jinja2 for chat, as vLLM does, then tokenized without special tokens; a completion's
  prompt with them). A template that needs more than messages, tools, add_generation_prompt and the
  special tokens, or a prompt the gateway cannot read as text, gives no ids: the policy then routes by
  the prompt's hash alone.

Token ids given as the prompt (a list of ints) are taken as they are. Pure; ~0.1 ms for a
1,000-word prompt with words (each word's id remembered), more with the model's tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.sim_words import token_id

Tokenize = Callable[[dict[str, Any], bool, int], list[int] | None]  # (body, chat, most tokens) -> ids or None
MAX_WORDS_KEPT = 1_000_000  # the words' ids remembered (~100 MB at most; then it starts over)


class _WordIds(dict[str, int]):
    """The ids of the words seen, computed once each: a dict lookup per word, in C, instead of a CRC."""

    def __missing__(self, word: str) -> int:
        if len(self) >= MAX_WORDS_KEPT:
            self.clear()
        found = self[word] = token_id(word)
        return found


_WORD_IDS = _WordIds()


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            parts.append(part["text"])
        return " ".join(parts)
    return None


def _given_ids(prompt: Any) -> list[int] | None:
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    return None


def words_tokens(body: dict[str, Any], chat: bool, most: int) -> list[int] | None:
    """The sim's ids of the prompt's first `most` words."""
    if chat:
        texts = [_text(m.get("content")) if isinstance(m, dict) else None for m in body.get("messages") or ()]
        if any(t is None for t in texts):
            return None
        text = " ".join(t for t in texts if t is not None)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return _given_ids(prompt)
        text = prompt
    return list(map(_WORD_IDS.__getitem__, text.split(maxsplit=most)[:most]))


class HfTokens:
    """The model's own tokenizer (tokenizer.json) and chat template (tokenizer_config.json)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        template = config.get("chat_template")
        self.template = None
        if isinstance(template, str):
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self.template = env.from_string(template)

    def __call__(self, body: dict[str, Any], chat: bool, most: int) -> list[int] | None:
        if not chat:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return _given_ids(prompt)
            return list(self.tokenizer.encode(prompt, add_special_tokens=True).ids[:most])
        if self.template is None:
            return None
        try:
            text = self.template.render(
                messages=body.get("messages") or [], tools=body.get("tools"), add_generation_prompt=True,
                **self.special,
            )  # fmt: skip
        except Exception:  # a template that wants more than we give: no ids, the hash decides
            return None
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids[:most])


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def make_tokenize(spec: str) -> Tokenize:
    """ "words", or a folder with tokenizer.json (ValueError saying what is missing otherwise)."""
    if spec == "words":
        return words_tokens
    folder = Path(spec).expanduser()
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer {spec!r}: no tokenizer.json in that folder; give the model's folder or 'words'")
    return HfTokens(folder)
