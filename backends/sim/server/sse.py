"""Response bodies, streamed and not, in vLLM's OpenAI-compatible shapes.

Streamed chunks are built from pre-encoded bytes: a per-request head and tail around
each token's pre-escaped JSON text, so a token costs a bytes concatenation.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from backends.sim.engine import words
from backends.sim.server.protocol import GenerationRequest

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
    """The chunks of one choice (`index`). A request with several choices has one builder per
    choice, made `like` the first one: the same id and created time, each its prompt's length."""

    num_reasoning = 0  # the answer's first tokens that are reasoning (backends/sim/reasoning.py)

    def __init__(
        self,
        request: GenerationRequest,
        model: str,
        index: int = 0,
        num_prompt: int | None = None,
        like: ResponseBuilder | None = None,
    ) -> None:
        self.request = request
        self.chat = request.chat
        if like is None:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
            self.created = int(time.time())
        else:
            self.id, self.created = like.id, like.created
        self.model = model
        self.index = index
        self.num_prompt = len(request.prompt_token_ids) if num_prompt is None else num_prompt
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        prefix = f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{json.dumps(model)},'
        self._prefix = prefix.encode()
        self._choice = f'"choices":[{{"index":{index},'.encode()
        self._head = self._prefix + self._choice + (b'"delta":{"content":"' if self.chat else b'"text":"')
        close = b'"},' if self.chat else b'",'
        self._tail = close + b'"logprobs":null,"finish_reason":null}]}\n\n'

    def first_chunk(self) -> bytes:
        """The chat stream opens with the assistant role and empty content, sent with the
        first token (vLLM sends it on the engine's first output, i.e. after prefill)."""
        if not self.chat:
            return b""
        body = b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
        return self._prefix + self._choice + body + self._usage_suffix(0) + b"}\n\n"

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
            choice = self._choice + b'"delta":{"content":"' + text + b'"},'
        else:
            choice = self._choice + b'"text":"' + text + b'",'
        choice += f'"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]'.encode()
        return self._prefix + choice + self._usage_suffix(num_completion) + b"}\n\n"

    def _usage_suffix(self, num_completion: int) -> bytes:
        if not self.request.continuous_usage:
            return b""
        return b',"usage":' + json.dumps(usage(self.num_prompt, num_completion)).encode()

    def end_chunks(self, finish_reason: str, num_completion: int, num_cached: int, sent_final: bool) -> bytes:
        """After the last token: a bare finish chunk if none was sent, usage if asked, [DONE]."""
        out = self.finish_chunk(finish_reason, num_completion, sent_final)
        return out + self.closing(self.num_prompt, num_completion, num_cached)

    def finish_chunk(self, finish_reason: str, num_completion: int, sent_final: bool) -> bytes:
        """This choice's bare finish chunk, unless its last token carried the finish_reason."""
        return b"" if sent_final else self._final_chunk(None, num_completion, finish_reason)

    def closing(self, num_prompt: int, num_completion: int, num_cached: int) -> bytes:
        """After every choice has finished: the usage if asked (as vLLM: each prompt's tokens
        once, the completion tokens of every choice), then [DONE]."""
        if not self.request.include_usage:
            return DONE
        body = json.dumps(usage(num_prompt, num_completion, num_cached))
        return self._prefix + b'"choices":[],"usage":' + body.encode() + b"}\n\n" + DONE

    def full(self, token_ids: list[int], finish_reason: str, num_cached: int) -> dict[str, Any]:
        return self.full_body([(token_ids, finish_reason)], self.num_prompt, num_cached)

    def full_body(self, outputs: list[tuple[list[int], str]], num_prompt: int, num_cached: int) -> dict[str, Any]:
        """The non-streamed answer: one choice per (tokens, finish_reason), in index order."""
        choices = []
        for index, (token_ids, finish_reason) in enumerate(outputs):
            text = text_of(token_ids)
            if self.chat:
                choice: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": index, "text": text}
            choice.update({"logprobs": None, "finish_reason": finish_reason, "stop_reason": None})
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(num_prompt, sum(len(tokens) for tokens, _ in outputs), num_cached),
        }
