"""Response bodies, streamed and not, in vLLM's OpenAI-compatible shapes.

Streamed chunks are built from pre-encoded bytes: a per-request head and tail around
each token's pre-escaped JSON text, so a token costs a bytes concatenation.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from backends.sim import words
from backends.sim.protocol import GenerationRequest

_TOKEN_JSON: tuple[bytes, ...] = tuple(json.dumps(t)[1:-1].encode() for t in words.TOKEN_TEXT)
DONE = b"data: [DONE]\n\n"


def text_of(token_ids: list[int]) -> str:
    texts = words.TOKEN_TEXT
    return "".join(texts[t] for t in token_ids)


def usage(num_prompt: int, num_completion: int, num_cached: int = 0) -> dict[str, Any]:
    details = {"cached_tokens": num_cached} if num_cached else None
    return {
        "prompt_tokens": num_prompt,
        "total_tokens": num_prompt + num_completion,
        "completion_tokens": num_completion,
        "prompt_tokens_details": details,
    }


class ResponseBuilder:
    def __init__(self, request: GenerationRequest, model: str) -> None:
        self.request = request
        self.chat = request.chat
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.num_prompt = len(request.prompt_token_ids)
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        prefix = f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{json.dumps(model)},'
        self._prefix = prefix.encode()
        opener = '"choices":[{"index":0,"delta":{"content":"' if self.chat else '"choices":[{"index":0,"text":"'
        self._head = self._prefix + opener.encode()
        close = b'"},' if self.chat else b'",'
        self._tail = close + b'"logprobs":null,"finish_reason":null}]}\n\n'

    def first_chunk(self) -> bytes:
        """The chat stream opens with the assistant role and empty content, sent with the
        first token (vLLM sends it on the engine's first output, i.e. after prefill)."""
        if not self.chat:
            return b""
        body = '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
        return self._prefix + body.encode() + self._usage_suffix(0) + b"}\n\n"

    def token_chunks(self, token_ids: list[int], num_before: int, finish_reason: str | None) -> bytes:
        """SSE events for tokens; the last carries finish_reason when the request ended."""
        out = []
        head, tail, texts = self._head, self._tail, _TOKEN_JSON
        plain = not self.request.continuous_usage
        last = len(token_ids) - 1
        for i, token in enumerate(token_ids):
            if i == last and finish_reason is not None:
                out.append(self._final_chunk(token, num_before + i + 1, finish_reason))
            elif plain:
                out.append(head + texts[token] + tail)
            else:
                out.append(self._chunk(texts[token], num_before + i + 1, None))
        return b"".join(out)

    def _final_chunk(self, token: int | None, num_completion: int, finish_reason: str) -> bytes:
        text = _TOKEN_JSON[token] if token is not None else b""
        return self._chunk(text, num_completion, finish_reason)

    def _chunk(self, text: bytes, num_completion: int, finish_reason: str | None) -> bytes:
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        if self.chat:
            choice = b'"choices":[{"index":0,"delta":{"content":"' + text + b'"},'
        else:
            choice = b'"choices":[{"index":0,"text":"' + text + b'",'
        choice += f'"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]'.encode()
        return self._prefix + choice + self._usage_suffix(num_completion) + b"}\n\n"

    def _usage_suffix(self, num_completion: int) -> bytes:
        if not self.request.continuous_usage:
            return b""
        return b',"usage":' + json.dumps(usage(self.num_prompt, num_completion)).encode()

    def end_chunks(self, finish_reason: str, num_completion: int, num_cached: int, sent_final: bool) -> bytes:
        """After the last token: a bare finish chunk if none was sent, usage if asked, [DONE]."""
        out = b"" if sent_final else self._final_chunk(None, num_completion, finish_reason)
        if self.request.include_usage:
            body = json.dumps(usage(self.num_prompt, num_completion, num_cached))
            out += self._prefix + b'"choices":[],"usage":' + body.encode() + b"}\n\n"
        return out + DONE

    def full(self, token_ids: list[int], finish_reason: str, num_cached: int) -> dict[str, Any]:
        text = text_of(token_ids)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update({"logprobs": None, "finish_reason": finish_reason, "stop_reason": None})
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(self.num_prompt, len(token_ids), num_cached),
        }
