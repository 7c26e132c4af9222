"""POST /tokenize and POST /detokenize, with vLLM's request and response shapes
(vllm/entrypoints/serve/tokenize/protocol.py):

    /tokenize    {"model"?, "prompt": str, "add_special_tokens"?, "return_token_strs"?}
              or {"model"?, "messages": [...], "add_generation_prompt"?, "continue_final_message"?, ...}
              -> {"count", "max_model_len", "tokens", "token_strs"}   (token_strs null unless asked)
    /detokenize  {"model"?, "tokens": [int, ...]} -> {"prompt": str}

The ids are the sim's own tokenizer's (words.py: one whitespace-separated word, one token),
the ids a completion with the same prompt gets, so count is the usage.prompt_tokens the sim
reports for it. The sim has no special tokens and no chat template: add_special_tokens and
add_generation_prompt change nothing, and a chat prompt is its messages' words.

A word of words.WORDS (every output token) has its index as id; any other word a hash of
it, which /detokenize reads back from the words this server's /tokenize has seen (the last
MAX_LEARNED; when two seen words share a hash, the later one). An id it has not seen reads
as <id N>. Words are joined by one space, so a prompt round-trips up to its whitespace.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from backends.sim.engine import words
from backends.sim.server.protocol import RequestError, chat_text, check_model
from backends.sim.settings import SimSettings

MAX_LEARNED = 100_000  # hashed words remembered for /detokenize (about 10 MB at most)
_FLAGS = ("add_special_tokens", "return_token_strs", "add_generation_prompt", "continue_final_message")


class LearnedWords:
    """The words behind hashed ids, as /tokenize saw them, oldest forgotten first."""

    def __init__(self, limit: int = MAX_LEARNED) -> None:
        self.limit = limit
        self._words: OrderedDict[int, str] = OrderedDict()

    def tokenize(self, text: str) -> list[int]:
        """words.tokenize(text), remembering the words behind hashed ids."""
        ids = []
        for word in text.split():
            token = words.token_id(word)
            if token >= len(words.WORDS):
                self._words[token] = word
                self._words.move_to_end(token)
                if len(self._words) > self.limit:
                    self._words.popitem(last=False)
            ids.append(token)
        return ids

    def text(self, token: int) -> str:
        if token < len(words.WORDS):
            return words.WORDS[token]
        return self._words.get(token, f"<id {token}>")


@dataclass(frozen=True, slots=True)
class Tokenized:
    tokens: list[int]
    token_strs: list[str] | None

    def body(self, max_model_len: int) -> dict[str, Any]:
        return {"count": len(self.tokens), "max_model_len": max_model_len, "tokens": self.tokens,
                "token_strs": self.token_strs}  # fmt: skip


def _object(body: Any, settings: SimSettings) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("The body must be a JSON object.")
    check_model(body, settings)
    return body


def tokenize(body: Any, settings: SimSettings, learned: LearnedWords) -> Tokenized:
    """A /tokenize body's ids; RequestError (400, vLLM's shape) for a body vLLM refuses too."""
    body = _object(body, settings)
    for flag in _FLAGS:
        if flag in body and not isinstance(body[flag], bool):
            raise RequestError(f"`{flag}` must be true or false; got {type(body[flag]).__name__}.", flag)
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise RequestError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "continue_final_message"
        )
    if "messages" in body:
        text = chat_text(body)
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif "prompt" in body:
        raise RequestError("`prompt` must be a string (the text to tokenize).", "prompt")
    else:
        raise RequestError("Send `prompt` (a string) or `messages` to /tokenize.", "prompt")
    ids = learned.tokenize(text)
    strs = [learned.text(token) for token in ids] if body.get("return_token_strs") else None
    return Tokenized(ids, strs)


def detokenize(body: Any, settings: SimSettings, learned: LearnedWords) -> str:
    """A /detokenize body's text; RequestError (400) unless `tokens` is a list of ids in the vocabulary."""
    tokens = _object(body, settings).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError("`tokens` must be a list of token ids (integers).", "tokens")
    bad = [t for t in tokens if not 0 <= t < words.VOCAB_SIZE]
    if bad:
        raise RequestError(f"Token id {bad[0]} is out of the vocabulary: ids are in [0, {words.VOCAB_SIZE}).", "tokens")
    return " ".join(learned.text(token) for token in tokens)
