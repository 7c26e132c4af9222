"""A stream that outlives its backend: when a one-choice stream breaks after its first token, the
gateway asks another backend to continue the answer from the text relayed so far, and the client
sees one stream.

vLLM continues a chat answer given as the last (assistant) message with `continue_final_message:
true, add_generation_prompt: false`, and a completion given its prompt followed by the text so
far. The continuation's chunks are rewritten to read as the first stream's: its `id`, `created`
and `model`; no second role chunk; usage counting the original prompt and every token relayed
(the continuation's extra prefill is the gateway's cost, counted apart).

`Transcript` keeps the reads a stream relayed (one list append per read; at most MAX_KEPT_BYTES)
and decodes them only when a continuation needs the text so far. A stream whose chunks carry
tool-call or reasoning deltas is not continued (it ends with the error event).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.endpoints.request import Call

_TOOL_OR_REASONING = (b'"tool_calls":', b'"reasoning":', b'"reasoning_content":', b'"function_call":')
_FINISHED = b'"finish_reason":"'  # a non-null finish reason (null is written without a quote)
_DONE = b"data: [DONE]"
MAX_KEPT_BYTES = 4 << 20  # a stream whose relayed events pass this is not continued (its memory is bounded)
# fields of a request whose answer a continuation could not reproduce (the whole prompt echoed,
# output constrained by a grammar from its start)
_NOT_CONTINUED = frozenset(("echo", "response_format", "structured_outputs", "guided_json", "guided_regex",
                            "guided_choice", "guided_grammar", "prompt_logprobs"))  # fmt: skip


def continuable(call: Call) -> bool:
    """Whether a break of this stream can be continued exactly: one choice of one prompt, a string
    prompt for completions, nothing that depends on the answer's start."""
    body = call.body
    if not call.stream or call.choices_per_prompt != 1 or len(call.prompt_estimates) != 1:
        return False
    if any(body[name] not in (None, False) for name in _NOT_CONTINUED.intersection(body)):  # (the ones it sent)
        return False
    if chat_call(call):
        messages = body.get("messages")
        return isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    return type(body.get("prompt")) is str or (type(body.get("prompt")) is list and type(body["prompt"][0]) is str)


def chat_call(call: Call) -> bool:
    return call.path.endswith("/chat/completions")


class Transcript:
    """What a one-choice stream relayed, kept as the reads that carried it (a list append per read:
    nothing is searched or decoded until a continuation needs the text)."""

    __slots__ = ("_chat", "num_bytes", "reads")

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self.reads: list[bytes] = []  # complete events, as relayed (before usage is cut for the client)
        self.num_bytes = 0

    def feed(self, events: bytes) -> None:
        if self.num_bytes <= MAX_KEPT_BYTES:
            self.reads.append(events)
            self.num_bytes += len(events)

    @property
    def ok(self) -> bool:
        """Whether the text can be continued: all of it kept, no tool-call or reasoning deltas."""
        return self.num_bytes <= MAX_KEPT_BYTES and not any(m in r for r in self.reads for m in _TOOL_OR_REASONING)

    @property
    def finished(self) -> bool:
        """A finish_reason came (in the last reads: it comes with the last token)."""
        return any(_FINISHED in r for r in self.reads[-3:])

    @property
    def reason(self) -> str:
        """The finish_reason that came ("stop", "length", ...; "" if none)."""
        for read in reversed(self.reads[-3:]):
            at = read.rfind(_FINISHED)
            if at >= 0:
                start = at + len(_FINISHED)
                end = read.find(b'"', start)
                return read[start:end].decode(errors="replace") if end > start else ""
        return ""

    @property
    def done(self) -> bool:
        return bool(self.reads) and _DONE in self.reads[-1]

    def head(self) -> dict[str, Any] | None:
        """id, created and model of the stream, from its first event."""
        first = self.reads[0] if self.reads else b""
        line = first[first.find(b"{") : first.find(b"\n")] if b"\n" in first else first[first.find(b"{") :]
        try:
            event = json.loads(line)
        except ValueError:
            return None
        if not isinstance(event, dict):
            return None
        return {k: event[k] for k in ("id", "created", "model") if k in event}

    def text(self) -> str | None:
        """The answer so far (None: it cannot be read exactly). The relayed bytes are joined and each
        compact `"content":"` (`"text":"` for completions) string is sliced out, then the slices are
        decoded as one JSON string: ~1 ms for a 4,000-token stream, where decoding every event took
        ~40 ms of the event loop (and a backend's death breaks all its streams at once)."""
        data = b"".join(self.reads)
        key, field = (b'"content":"', b'"content"') if self._chat else (b'"text":"', b'"text"')
        pieces: list[bytes] = []
        at = data.find(key)
        while at >= 0:
            start = at + len(key)
            end = _string_end(data, start)
            if end < 0:
                return None
            pieces.append(data[start:end])
            at = data.find(key, end)
        if len(pieces) != data.count(field):  # a field written otherwise (spaces, null): not sliced exactly
            return None
        try:
            text = json.loads(b'"' + b"".join(pieces) + b'"')
        except ValueError:
            return None
        return text if isinstance(text, str) else None


def _string_end(data: bytes, start: int) -> int:
    """The index of the quote that closes the JSON string starting at `start` (-1: none)."""
    end = data.find(b'"', start)
    while end >= 0:
        backslashes = 0
        while data[end - 1 - backslashes] == 0x5C:  # a backslash
            backslashes += 1
        if backslashes % 2 == 0:
            return end
        end = data.find(b'"', end + 1)
    return -1


def continued_body(call: Call, text: str, num_relayed: int, upstream_model: str | None) -> bytes | None:
    """The request that continues the answer after `text` (num_relayed tokens), or None when no
    token is left to make (the answer used its whole budget)."""
    body: dict[str, Any] = dict(call.body)
    if upstream_model:
        body["model"] = upstream_model
    for name in ("max_completion_tokens", "max_tokens"):
        asked = body.get(name)
        if type(asked) is int:
            if asked - num_relayed < 1:
                return None
            body[name] = asked - num_relayed
    if chat_call(call):
        messages = list(body["messages"])
        last = messages[-1] if messages else None
        if body.get("continue_final_message") and isinstance(last, dict) and isinstance(last.get("content"), str):
            messages[-1] = {**last, "content": last["content"] + text}  # the client continued one already
        else:
            messages.append({"role": "assistant", "content": text})
        body["messages"] = messages
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    else:
        prompt = body["prompt"]
        body["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + text
    return json.dumps(body).encode()


class Rewriter:
    """Rewrites a continuation's events to read as the original stream's."""

    __slots__ = ("_chat", "_head", "_pending", "base_completion", "prompt_tokens", "upstream_prompt_tokens")

    def __init__(self, chat: bool, head: dict[str, Any], prompt_tokens: int | None, base_completion: int) -> None:
        self._chat = chat
        self._head = head  # id, created, model of the original stream
        self.prompt_tokens = prompt_tokens  # the original prompt's (None: the backend reported none)
        self.base_completion = base_completion  # tokens relayed before this continuation
        self.upstream_prompt_tokens: int | None = None  # the continuation's own prompt (its extra prefill)
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        data, self._pending = self._pending + data, b""
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        data, self._pending = data[: end + 2], data[end + 2 :]
        out: list[bytes] = []
        for event in data.split(b"\n\n")[:-1]:
            rewritten = self._event(event)
            if rewritten is not None:
                out.append(rewritten + b"\n\n")
        return b"".join(out)

    def rest(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._event(rest) or b"" if rest.strip() else b""

    def _event(self, event: bytes) -> bytes | None:
        line = event.strip()
        if not line.startswith(b"data:") or not line[5:].strip().startswith(b"{"):
            return event  # [DONE], comments
        try:
            payload = json.loads(line[5:])
        except ValueError:
            return event
        if not isinstance(payload, dict):
            return event
        payload.update(self._head)
        choices = payload.get("choices")
        if self._chat and isinstance(choices, list) and choices and all(_role_only(c) for c in choices):
            return None  # the client had its role chunk from the first stream
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()

    def _usage(self, usage: dict[str, Any]) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if type(prompt) is int and self.upstream_prompt_tokens is None:
            self.upstream_prompt_tokens = prompt
        if type(completion) is int:
            usage["completion_tokens"] = completion + self.base_completion
        if self.prompt_tokens is not None and type(prompt) is int:
            usage["prompt_tokens"] = self.prompt_tokens
        if type(usage.get("prompt_tokens")) is int and type(usage.get("completion_tokens")) is int:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def _role_only(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if not isinstance(delta, dict) or "role" not in delta:
        return False
    return not delta.get("content") and choice.get("finish_reason") is None
