"""What the users send from a dataset file: its items sampled (shuffled with a seed, or in the file's
order), cut to `dataset_limit`, and sent in that order round and round; a ShareGPT conversation's turns
one after another by one user (`dataset_turns: "all"`).

Each body is the item's own, as written (no nonce, no word changed), with the run's fields on top:
`model` (the model of the run), `stream` and, streamed, `stream_options.include_usage` (the harness
times the stream and reads its usage); and under it, where the line does not set them, `max_tokens`
(workload.max_output_tokens), `ignore_eos` and `temperature`. A ShareGPT turn's `max_tokens` is its
reply's length in the engine's tokens (its /tokenize; one word a token without one).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loadgen.datasets import Dataset, DatasetItem, Turn
from loadreport.settings import Settings

log = logging.getLogger("zerogap.loadtest")
Counter = Callable[[str], int | None]
Mapper = Callable[[Callable[[Turn], int | None], Iterable[Turn]], Iterator[int | None]]


def choose(dataset: Dataset, order: str, seed: int, limit: int | None) -> list[DatasetItem]:
    """The items a run sends, in the order it sends them."""
    items = list(dataset.items)
    if order == "random":
        random.Random(seed).shuffle(items)
    return items[:limit] if limit is not None else items


def count_replies(items: list[DatasetItem], counter: Counter | None, mapper: Mapper = map) -> str:
    """Set each ShareGPT turn's max_tokens to its reply's token count; returns how it was counted:
    "tokenize" (every reply by the engine's /tokenize), "approx" (one word a token), or "dataset"
    (no reply to count: the bodies say their own max_tokens)."""
    turns = [turn for item in items for turn in item.turns if turn.reply is not None]
    if not turns:
        return "dataset"

    def count(turn: Turn) -> int | None:
        return counter(turn.reply or "") if counter is not None else None

    approx = 0
    for turn, counted in zip(turns, mapper(count, turns), strict=True):
        if counted is None:
            approx += 1
            counted = len((turn.reply or "").split())
        turn.body["max_tokens"] = max(1, counted)
    if approx:
        log.warning("zerogap: %d of %d replies counted as one word a token (no /tokenize answered)", approx, len(turns))
    return "approx" if approx else "tokenize"


class DatasetBodies:
    """Each turn's request body, encoded once; the items shared by every user of the process."""

    def __init__(self, settings: Settings, model: str, items: list[DatasetItem]) -> None:
        self.settings = settings
        self.model = model
        self.items = items
        self.position = 0
        self._encoded: dict[tuple[int, int], bytes] = {}

    def next_item(self) -> int:
        index = self.position % len(self.items)
        self.position += 1
        return index

    def body(self, index: int, turn: int) -> bytes:
        key = (index, turn)
        encoded = self._encoded.get(key)
        if encoded is None:
            encoded = self._encoded[key] = json.dumps(self.payload(self.items[index].turns[turn])).encode()
        return encoded

    def payload(self, turn: Turn) -> dict[str, Any]:
        return request_payload(self.settings, self.model, turn.body)


def request_payload(settings: Settings, model: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The body sent: fields as written, the run's model and streaming on top, its defaults under."""
    w = settings.workload
    payload: dict[str, Any] = {"temperature": w.temperature}
    if w.ignore_eos:
        payload["ignore_eos"] = True
    if "max_completion_tokens" not in fields:
        payload["max_tokens"] = w.max_output_tokens
    payload.update(fields)
    payload["model"] = model
    payload["stream"] = w.stream
    if w.stream:
        options = payload.get("stream_options")
        payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    else:
        payload.pop("stream_options", None)
    return payload


class DatasetSession:
    """One user's place in the dataset: an item, and with several turns the next one of them."""

    def __init__(self, bodies: DatasetBodies) -> None:
        self.bodies = bodies
        self.item = -1
        self.turn = 0

    @property
    def last_line(self) -> int:
        """The file line of the latest body's item, for requests.csv."""
        return self.bodies.items[self.item].line if self.item >= 0 else 0

    def body(self, model: str) -> bytes:
        turns = self.bodies.items[self.item].turns if self.item >= 0 else []
        if self.item < 0 or self.turn + 1 >= len(turns):
            self.item, self.turn = self.bodies.next_item(), 0
        else:
            self.turn += 1
        return self.bodies.body(self.item, self.turn)

    def answered(self, num_output_tokens: int) -> None:
        """The conversation's replies are the file's own: nothing of the answer is kept."""
