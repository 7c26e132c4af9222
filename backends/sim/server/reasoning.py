"""The sim as a reasoning model: `[sim] reasoning_tokens` makes a chat answer's first tokens its
reasoning, streamed as vLLM 0.32 streams a reasoning parser's output: `{"delta": {"reasoning": ...}}`
chunks first, then the answer's `{"delta": {"content": ...}}`; the usage carries
`completion_tokens_details.reasoning_tokens` (on every chunk too with continuous_usage_stats), and a
non-streamed answer's message has `reasoning` beside `content`.

reasoning_tokens >= 1 is a count per request, below 1 a share of the request's max_tokens (rounded);
either way at most max_tokens (a request that ends first, at EOS or a stop word, may be all reasoning).
The engine does not change: a reasoning token costs what any output token costs. Completions and
requests with several choices answer without reasoning, as a completions endpoint does.
"""

from __future__ import annotations

import json
from typing import Any

from backends.sim.server.protocol import GenerationRequest
from backends.sim.server.sse import _TOKEN_JSON, DONE, ResponseBuilder, text_of, usage
from backends.sim.settings import SimSettings


def num_reasoning(setting: float, max_tokens: int) -> int:
    """A request's reasoning tokens: a count (>= 1) or a share of max_tokens (< 1)."""
    count = int(setting) if setting >= 1 else round(setting * max_tokens)
    return max(0, min(count, max_tokens))


def response_builder(request: GenerationRequest, settings: SimSettings) -> ResponseBuilder:
    """The builder of a one-choice answer: a reasoning one for chat when [sim] reasoning_tokens asks."""
    count = num_reasoning(settings.cost.reasoning_tokens, request.max_tokens) if request.chat else 0
    if count:
        return ReasoningBuilder(request, settings.model, count)
    return ResponseBuilder(request, settings.model)


class ReasoningBuilder(ResponseBuilder):
    def __init__(self, request: GenerationRequest, model: str, num_reasoning: int) -> None:
        super().__init__(request, model)
        self.num_reasoning = num_reasoning
        self._reasoning_head = self._prefix + self._choice + b'"delta":{"reasoning":"'

    def token_chunks(self, token_ids: list[int], num_before: int, finish_reason: str | None) -> bytes:
        split = max(0, min(len(token_ids), self.num_reasoning - num_before))
        if not split:
            return super().token_chunks(token_ids, num_before, finish_reason)
        out = []
        last = len(token_ids) - 1
        for i in range(split):
            out.append(self._reasoning_chunk(token_ids[i], num_before + i + 1, finish_reason if i == last else None))
        if split < len(token_ids):
            out.append(super().token_chunks(token_ids[split:], num_before + split, finish_reason))
        return b"".join(out)

    def _reasoning_chunk(self, token: int, num_completion: int, finish_reason: str | None) -> bytes:
        text = _TOKEN_JSON[token]
        if finish_reason is None and not self.request.continuous_usage:
            return self._reasoning_head + text + b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        tail = f'"}},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]'.encode()
        return self._reasoning_head + text + tail + self._usage_suffix(num_completion) + b"}\n\n"

    def _usage(self, num_prompt: int, num_completion: int, num_cached: int = 0) -> dict[str, Any]:
        figures = usage(num_prompt, num_completion, num_cached)
        figures["completion_tokens_details"] = {"reasoning_tokens": min(num_completion, self.num_reasoning)}
        return figures

    def _usage_suffix(self, num_completion: int) -> bytes:
        if not self.request.continuous_usage:
            return b""
        return b',"usage":' + json.dumps(self._usage(self.num_prompt, num_completion)).encode()

    def closing(self, num_prompt: int, num_completion: int, num_cached: int) -> bytes:
        if not self.request.include_usage:
            return DONE
        body = json.dumps(self._usage(num_prompt, num_completion, num_cached))
        return self._prefix + b'"choices":[],"usage":' + body.encode() + b"}\n\n" + DONE

    def full_body(self, outputs: list[tuple[list[int], str]], num_prompt: int, num_cached: int) -> dict[str, Any]:
        body = super().full_body(outputs, num_prompt, num_cached)
        tokens = outputs[0][0]
        message = body["choices"][0]["message"]
        message["content"] = text_of(tokens[self.num_reasoning :]) or None
        message["reasoning"] = text_of(tokens[: self.num_reasoning]) or None
        body["usage"] = self._usage(num_prompt, len(tokens), num_cached)
        return body
