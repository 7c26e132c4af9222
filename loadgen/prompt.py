"""Prompts of the asked token length.

With the backend's /tokenize (vLLM's, or any server answering {"count": N} or
{"tokens": [...]}) the text is calibrated until it counts the asked number of tokens.
Without one, the documented approximation: one common short English word (with its
leading space) is one token for BPE tokenizers of real models. The chat template adds
a few tokens either way; usage.prompt_tokens in the report shows the real count.
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from loadreport.settings import Settings

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did"
).split()

WORDS: tuple[str, ...] = tuple(_WORDS)
Counter = Callable[[str], int | None]


def words(num_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


def tokenize_counter(
    urls: list[str], model: str, timeout_s: float, headers: dict[str, str] | None = None, explicit: str = ""
) -> Counter:
    """A counter that asks the first URL that answers; None when none does. `headers` (the API key)
    go to the URLs derived from the API's base URL (a zerogap gateway checks the key on /tokenize),
    never to an explicit tokenize_url, which may be another host."""
    working: list[str] = []

    def count(text: str) -> int | None:
        for url in working or urls:
            number = _ask(url, model, text, timeout_s, None if url == explicit else headers)
            if number is not None:
                working[:] = [url]
                return number
        return None

    return count


def _ask(url: str, model: str, text: str, timeout_s: float, headers: dict[str, str] | None = None) -> int | None:
    body = json.dumps({"model": model, "prompt": text}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    if isinstance(answer, dict):
        if isinstance(answer.get("count"), int):
            return int(answer["count"])
        if isinstance(answer.get("tokens"), list):
            return len(answer["tokens"])
    return None


def tokenize_urls(base_url: str, explicit: str) -> list[str]:
    """The explicit URL, else {base_url}/tokenize and the server root's /tokenize."""
    if explicit:
        return [explicit]
    parts = urlsplit(base_url)
    root = f"{parts.scheme}://{parts.netloc}/tokenize"
    first = f"{base_url.rstrip('/')}/tokenize"
    return [first] if first == root else [first, root]


def calibrate(target_tokens: int, counter: Counter | None, prefix: str = "", max_rounds: int = 6) -> tuple[str, str]:
    """(text, how) such that prefix + text counts target_tokens; how is "tokenize" when a
    tokenizer confirmed the length, else "approx" (one word, prefix words included, per token)."""
    approx_words = max(1, target_tokens - len(prefix.split()))
    if counter is None:
        return words(approx_words), "approx"
    num_words = approx_words
    best: tuple[int, str] | None = None
    for _ in range(max_rounds):
        text = words(num_words)
        counted = counter(prefix + text)
        if counted is None or counted <= 0:
            break
        if best is None or abs(counted - target_tokens) < best[0]:
            best = (abs(counted - target_tokens), text)
        if counted == target_tokens:
            break
        num_words = max(1, num_words + round((target_tokens - counted) * num_words / counted))
    if best is None:
        return words(approx_words), "approx"
    return best[1], "tokenize"


def request_body(settings: Settings, prompt: str, model: str, messages: list[dict[str, str]] | None = None) -> bytes:
    """One request (streamed unless workload.stream is false): usage asked for, ignore_eos so
    outputs run to max_output_tokens. A non-streamed answer carries its usage anyway.
    messages (shared-prefix and multi-turn workloads) replace the one user message of prompt;
    for /v1/completions their texts are joined."""
    workload = settings.workload
    text = f"{random.randrange(10**6):06d} {prompt}" if workload.unique_prompts else prompt
    if messages is None:
        messages = [{"role": "user", "content": text}]
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": workload.max_output_tokens,
        "stream": workload.stream,
        "temperature": workload.temperature,
    }
    if workload.stream:
        payload["stream_options"] = {"include_usage": True}
    if workload.ignore_eos:
        payload["ignore_eos"] = True
    if settings.api.endpoint == "chat":
        payload["messages"] = messages
    else:
        payload["prompt"] = "\n\n".join(m["content"] for m in messages)
    return json.dumps(payload).encode()
