"""The gateway's subscription to the engines' KV-cache events (routing = "kv_events"), in every
gateway process: per engine with a `kv_events_endpoint`, a ZeroMQ SUB socket on the event loop,
each batch decoded (common/kv_events.py) and applied to the index of every pool's policy that
listens (gateway/pool/routing/kv_index.py).

With a `kv_events_replay_endpoint`, the engine's buffer is read first (what it cached before this
process started), and a gap in the sequence numbers (batches the SUB socket dropped) is asked for
again. A sequence number below the last one means the engine restarted: its blocks are forgotten.
ZeroMQ reconnects by itself; an engine that is down publishes nothing, and is not a candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import zmq
import zmq.asyncio

from common.kv_events import END_SEQ, KVEventBatch, decode_batch, seq_bytes, seq_of
from gateway.pool.model_pool import Backend, Router
from gateway.pool.routing.kv_index import KvIndex

REPLAY_TIMEOUT_S = 2.0
log = logging.getLogger("zerogap.gateway.kv_events")


class EngineFeed:
    """One engine's events into the indexes that want them."""

    def __init__(self, context: zmq.asyncio.Context, backend: Backend, indexes: list[KvIndex]) -> None:
        assert backend.kv_events_endpoint is not None
        self.context = context
        self.backend = backend
        self.indexes = indexes
        self.topic = backend.kv_events_topic.encode()
        self.last_seq = -1
        self.num_batches = 0
        self.num_undecodable = 0

    def apply(self, seq: int, payload: bytes) -> None:
        try:
            batch: KVEventBatch = decode_batch(payload)
        except msgspec.DecodeError as exc:
            self.num_undecodable += 1
            if self.num_undecodable == 1:
                log.warning("KV events of %s: batch %d is not vLLM's format (%s)", self.backend.name, seq, exc)
            return
        if seq < self.last_seq:  # a new publisher: the engine restarted with an empty cache
            log.info("KV events of %s start again at %d (after %d): its blocks are forgotten",
                     self.backend.name, seq, self.last_seq)  # fmt: skip
            for index in self.indexes:
                index.forget(self.backend.url)
        self.last_seq = seq
        self.num_batches += 1
        for index in self.indexes:
            index.apply(self.backend.url, batch.events)

    async def replay(self, start: int) -> None:
        """Ask the replay socket for every batch from `start` on and apply the ones not seen."""
        endpoint = self.backend.kv_events_replay_endpoint
        if endpoint is None:
            return
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(endpoint)
        try:
            await dealer.send_multipart((b"", seq_bytes(start)))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 4 or frames[2] == END_SEQ:
                    return
                seq = seq_of(frames[2])
                if seq > self.last_seq:
                    self.apply(seq, frames[3])
        except TimeoutError:
            log.warning("KV events of %s: no replay from %s within %.0f s", self.backend.name, endpoint,
                        REPLAY_TIMEOUT_S)  # fmt: skip
        finally:
            dealer.close(linger=0)

    async def follow(self) -> None:
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        assert self.backend.kv_events_endpoint is not None
        sub.connect(self.backend.kv_events_endpoint)
        log.info("following the KV events of %s at %s", self.backend.name, self.backend.kv_events_endpoint)
        try:
            await self.replay(0)
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = seq_of(frames[1])
                if self.last_seq >= 0 and seq > self.last_seq + 1:
                    await self.replay(self.last_seq + 1)
                if seq > self.last_seq or seq < self.last_seq - 1:  # new, or a restarted engine's
                    self.apply(seq, frames[2])
        finally:
            sub.close(linger=0)


class KvListener:
    """Every engine's feed, as tasks on this process's event loop."""

    def __init__(self, router: Router) -> None:
        self.context = zmq.asyncio.Context()
        self.feeds: list[EngineFeed] = []
        for backend in router.backends:
            pool = router.pools[backend.model]
            index = getattr(pool.policy, "index", None)
            if backend.kv_events_endpoint is not None and isinstance(index, KvIndex):
                self.feeds.append(EngineFeed(self.context, backend, [index]))
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for feed in self.feeds:
            task = asyncio.create_task(feed.follow(), name=f"kv-events-{feed.backend.name}")
            task.add_done_callback(_finished)
            self._tasks.append(task)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.context.term()


def _finished(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a KV-event feed stopped", exc_info=task.exception())
