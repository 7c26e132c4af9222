"""A request with several choices: n > 1, a completions list of prompts, or both (as vLLM 0.32).

Each choice is a sequence of its own in the engine (n per prompt, in order: the choice index is
prompt_index * n + i), so the scheduler, the KV blocks and the metrics see every one, as vLLM's
engine sees the requests its OpenAI server fans a request out to. They stream interleaved, as the
steps make their tokens, one choice per chunk; with continuous usage each chunk counts its prompt's
tokens and that choice's completion tokens so far. A chat stream's n role chunks go out together,
with the first token of any choice (vLLM: on the request's first output). Each choice ends with
its own finish chunk; after the last one, the request's usage (each prompt's tokens once, the
completion tokens of every choice) and [DONE]. Not streamed: one body, every choice in index order.

prompt_tokens_details.cached_tokens (only when some are) sums each prompt's first choice's cached
tokens: the sim's sibling sequences do not share a prompt's blocks while it is being prefilled.
"""

from __future__ import annotations

import asyncio
from typing import Any

from backends.sim.server.protocol import GenerationRequest
from backends.sim.server.sse import ResponseBuilder
from backends.sim.server.stream import SseWriter, TokenSink, Transport


class Choices:
    """One request's choices: their sinks and builders in index order, and one Future, set when
    every choice has finished or one was aborted (its client went away: the handler aborts the rest)."""

    def __init__(self, request: GenerationRequest, model: str, sinks: list[TokenSink]) -> None:
        prompts = request.prompts
        self.n = request.n
        self.num_prompts = len(prompts)
        if len(sinks) != self.n * self.num_prompts:
            raise ValueError(f"{len(sinks)} sinks for {self.num_prompts} prompts x n = {self.n}")
        self.sinks = sinks
        first = ResponseBuilder(request, model)
        self.builders = [
            ResponseBuilder(request, model, index, len(prompts[index // self.n][0]), like=first)
            for index in range(len(sinks))
        ]
        self.num_prompt_tokens = sum(len(prompt) for prompt, _ in prompts)  # each prompt once, not n times
        self.num_open = len(sinks)
        self.num_ended = 0  # streamed: choices whose finish has been written
        self.num_completion = 0  # ... and their completion tokens
        self.writers: list[ChoiceWriter] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for sink in sinks:
            sink.group = self

    def closed(self, finish_reason: str) -> None:
        """A choice's sink closed (finished, or aborted)."""
        self.num_open -= 1
        if (finish_reason == "abort" or self.num_open == 0) and not self.done.done():
            self.done.set_result(None)

    def num_cached(self) -> int:
        return sum(self.sinks[p * self.n].seq.num_cached_tokens for p in range(self.num_prompts))

    def body(self) -> dict[str, Any]:
        """The non-streamed answer, once done."""
        outputs = [(sink.tokens, sink.finish_reason or "abort") for sink in self.sinks]
        return self.builders[0].full_body(outputs, self.num_prompt_tokens, self.num_cached())

    def attach(self, transport: Transport, chunked: bool) -> bool:
        """Start streaming every choice (what piled up first, in index order); False when the client is gone."""
        opener = b"".join(builder.first_chunk() for builder in self.builders)  # chat: the n role chunks
        self.writers = [ChoiceWriter(transport, builder, chunked, self, opener) for builder in self.builders]
        return all(sink.attach(writer) for sink, writer in zip(self.sinks, self.writers, strict=True))


class ChoiceWriter(SseWriter):
    """One choice's writer: the role chunks go out with whichever choice writes first, and the
    request's usage and [DONE] after whichever finishes last."""

    __slots__ = ("group",)

    def __init__(self, transport: Transport, builder: ResponseBuilder, chunked: bool, group: Choices, opener: bytes):
        super().__init__(transport, builder, chunked)
        self.group = group
        self.opener = opener

    def open(self) -> bytes:
        opener = self.opener
        for writer in self.group.writers:
            writer.opener = b""
        return opener

    def end(self, finish_reason: str, num_completion: int, num_cached: int, sent_final: bool) -> bytes:
        out = self.builder.finish_chunk(finish_reason, num_completion, sent_final)
        group = self.group
        group.num_ended += 1
        group.num_completion += num_completion
        if group.num_ended == len(group.sinks):
            out += self.builder.closing(group.num_prompt_tokens, group.num_completion, group.num_cached())
        return out
