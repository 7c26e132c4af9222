"""What a stream with several choices used: `n > 1`, `best_of`, or a completions request with a
list of prompts.

vLLM puts on each chunk of such a stream the usage of *that chunk's choice* when it is asked for
`continuous_usage_stats` (`completion_tokens` = the tokens made so far for that choice only, and
`prompt_tokens` = the prompt of that choice's prompt); only the final usage-only chunk
(`choices: []`) has the sums. A stream cut before that chunk must be charged the sum over its
choices of the last usage seen for each, and each prompt once. A choice's index is
`prompt_index * n + i` (vLLM's serving_completion; chat has one prompt).

These streams are rare next to single-choice ones, so each event is decoded here (the
single-choice stream keeps sse.SseFilter's path that decodes nothing). A backend that reports no
usage is charged one token per chunk of each choice, less each chat choice's role-only opener.
"""

from __future__ import annotations

from typing import Any

from gateway.relay.sse_events import json_events


class ChoiceUsage:
    __slots__ = ("_chat", "_chunks", "_completion", "_final", "_n", "_prompt", "_prompt_estimates", "_reasons")

    def __init__(self, chat: bool, n: int, prompt_estimates: list[int]) -> None:
        self._chat = chat
        self._n = max(1, n)  # choices per prompt
        self._prompt_estimates = prompt_estimates  # per prompt, for prompts no usage was seen of
        self._completion: dict[int, int] = {}  # choice index -> its last completion_tokens
        self._prompt: dict[int, int] = {}  # prompt index -> its prompt_tokens
        self._chunks: dict[int, int] = {}  # choice index -> chunks counted (when no usage comes)
        self._final: tuple[int, int] | None = None  # the final usage chunk's sums
        self._reasons: dict[int, str] = {}  # choice index -> its finish_reason (the request log's, the spans')

    def feed(self, events: bytes) -> None:
        """Complete SSE events as the backend sent them (before any usage is cut for the client)."""
        for event in json_events(events):
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        choices = event.get("choices")
        usage = _counts(event.get("usage"))
        if not isinstance(choices, list):
            return
        if not choices:
            if usage is not None:
                self._final = usage
            return
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if type(index) is not int or index < 0:
                continue
            reason = choice.get("finish_reason")
            if type(reason) is str:
                self._reasons[index] = reason
            if not (self._chat and _role_only(choice)):
                self._chunks[index] = self._chunks.get(index, 0) + 1
            if usage is not None and len(choices) == 1:
                prompt, completion = usage
                self._completion[index] = completion
                self._prompt[0 if self._chat else index // self._n] = prompt

    def finish_reasons(self) -> list[str]:
        """Every choice's finish_reason in the order of their indexes, up to the highest index seen ("" for
        one that had none: a stream cut before it ended), [] when no choice finished."""
        if not self._reasons:
            return []
        return [self._reasons.get(i, "") for i in range(max(self._chunks.keys() | self._reasons.keys()) + 1)]

    def reported(self) -> tuple[int | None, int | None, bool]:
        """(prompt, completion, exact): the final sums if they came; else each choice's last usage
        (its chunks counted where it had none) and each prompt once (estimated where none came);
        None where the backend said nothing at all."""
        if self._final is not None:
            return self._final[0], self._final[1], True
        if not self._completion:
            completion = sum(self._chunks.values()) if self._chunks else None
            return None, completion, False
        completion = sum(self._completion.get(i, n) for i, n in self._chunks.items())
        completion += sum(c for i, c in self._completion.items() if i not in self._chunks)
        exact = all(i in self._completion for i in self._chunks)
        prompts = 1 if self._chat else max(1, len(self._prompt_estimates))
        prompt = 0
        for p in range(prompts):
            if p in self._prompt:
                prompt += self._prompt[p]
            else:
                prompt += self._prompt_estimates[p] if p < len(self._prompt_estimates) else 0
                exact = False
        return prompt, completion, exact


def _counts(usage: object) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is int and type(completion) is int and prompt >= 0 and completion >= 0:
        return prompt, completion
    return None


def _role_only(choice: dict[str, Any]) -> bool:
    """A chat choice's opener: its role and no text, tool call or reasoning yet (vLLM sends one per choice)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict) or "role" not in delta:
        return False
    return not any(delta.get(k) for k in ("content", "tool_calls", "reasoning_content", "reasoning"))
