"""What a request is charged: the prompt and the completion tokens that were relayed.

A stream that ends early (client gone, backend broke, idle timeout, ejection, drain) is charged
what it got, not nothing: the backend's own usage from the last chunk that carried one (exact
with `continuous_usage_stats`), else the relayed chunks counted and the prompt estimated at
4 bytes of the request body per token (the same estimate the tpm reservation makes). A request
the client abandons after it went to a backend is charged its prompt (the engine may have run
the prefill): hanging up before the first token is no way around the limits.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from gateway.endpoints.request import BYTES_PER_TOKEN, Call  # 4 bytes a token where the backend says nothing
from gateway.observe.metrics import GatewayMetrics
from gateway.relay.choice_usage import ChoiceUsage
from gateway.relay.exchange import Charge, Exchange
from gateway.relay.sse import SseFilter
from gateway.tenants.limits import Limiter
from gateway.tenants.usage import UsageRecorder

log = logging.getLogger("zerogap.gateway.relay")  # the request's line, as the relay logs it


def prompt_estimate(call: Call) -> int:
    return math.ceil(len(call.raw) / BYTES_PER_TOKEN)


def of_stream(call: Call, filt: SseFilter) -> Charge:
    if filt.choices is not None:  # several choices: each one's own usage, summed (choice_usage.py)
        prompt, completion, exact = filt.choices.reported()
        if prompt is None:
            prompt, exact = sum(call.prompt_estimates) or prompt_estimate(call), False
        return Charge(prompt, completion or 0, exact)
    prompt, completion = filt.reported()
    if prompt is not None and completion is not None:
        return Charge(prompt, completion, exact=True)
    return Charge(prompt if prompt is not None else prompt_estimate(call), max(0, filt.num_chunks), exact=False)


def choice_usage(call: Call) -> ChoiceUsage | None:
    """The per-choice account of a request with several choices (n, best_of, a list of prompts)."""
    if call.choices_per_prompt * len(call.prompt_estimates) <= 1:
        return None
    return ChoiceUsage(call.path.endswith("/chat/completions"), call.choices_per_prompt, call.prompt_estimates)


def of_body(call: Call, answer: Any) -> Charge:
    """A whole (not streamed) answer: its usage, else its text estimated at 4 bytes a token."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int) and _count(prompt) and _count(completion):
            return Charge(prompt, completion, exact=True)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    text_bytes = sum(len(str(_text(c)).encode()) for c in choices) if isinstance(choices, list) else 0
    return Charge(prompt_estimate(call), math.ceil(text_bytes / BYTES_PER_TOKEN), exact=False)


def abandoned(call: Call) -> Charge:
    """The client went away before any answer came, after the request went to a backend. A
    non-streamed request the backend could not stream (prompt_logprobs) may have made its whole
    answer unseen: it is charged its whole completion budget."""
    unseen = call.budget_tokens if not call.stream and not call.assembled else 0
    return Charge(prompt_estimate(call), unseen, exact=False)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(choice: object) -> object:
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message")
    if isinstance(message, dict):
        return message.get("content") or ""
    return choice.get("text") or ""


def settle(exchange: Exchange, m: GatewayMetrics, limiter: Limiter, usage: UsageRecorder) -> tuple[int, int]:
    """The request's metrics, and its charge: usage, token metrics, and the tpm reservation
    replaced by what it used. Called once per request, however it ended (the relay's finally).
    The prompt and completion tokens charged (the request log's)."""
    call, who, backend = exchange.call, exchange.who, exchange.backend
    status = str(exchange.status)
    now = time.monotonic()
    charge = exchange.charge
    if charge is None and exchange.status == 499 and backend != "none":  # gone before the answer came
        charge = abandoned(call)
    prompt, completion = (charge.prompt_tokens, charge.completion_tokens) if charge is not None else (0, 0)
    first_s, last_s = exchange.first_s, exchange.last_s
    ttft_s = tpot_s = None
    if call.stream and first_s is not None:
        ttft_s = first_s - exchange.t0_s
        if completion > 1 and last_s is not None:
            tpot_s = (last_s - first_s) / (completion - 1)
    # requests, duration, ttft, tpot, tokens: applied in batches (gateway/observe/settled.py)
    m.settled.add((call.model, backend, who.name, status, now - exchange.t0_s, ttft_s, tpot_s, prompt, completion))
    if prompt or completion:
        usage.record(who.name, call.model, prompt, completion)
    if who.limits.tpm is not None:
        limiter.settle(who, exchange.estimate, prompt + completion)
    if log.isEnabledFor(logging.DEBUG):
        ttft_ms = f"{1000 * (first_s - exchange.t0_s):.1f}" if first_s is not None else "-"
        log.debug(
            "%s model=%s key=%s backend=%s status=%s ttft_ms=%s duration_ms=%.1f tokens=%d+%d%s",
            call.path, call.model, who.name, backend, status, ttft_ms, 1000 * (now - exchange.t0_s),
            prompt, completion, "" if charge is None or charge.exact else " (estimated: no usage from the backend)",
        )  # fmt: skip
    return prompt, completion
