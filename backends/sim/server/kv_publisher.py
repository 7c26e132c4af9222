"""The sim's KV-cache events on the wire, as vLLM's ZmqEventPublisher sends them
(common/kv_events.py): a PUB socket gets (topic, sequence number, msgpack batch) per step
that changed the cache; an optional ROUTER socket replays the buffered batches from a
sequence number, then the end marker. On the event loop: a PUB send never blocks (past the
high-water mark ZeroMQ drops, as vLLM's does); the replay socket is read by a task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from common.config.sim import SimSection
from common.kv_events import END_SEQ, KvEvent, KVEventBatch, encode_batch, seq_bytes, seq_of

HWM = 100_000
_log = logging.getLogger("zerogap.sim.kv_events")


class KvEventPublisher:
    def __init__(self, settings: SimSection) -> None:
        assert settings.kv_events_endpoint is not None
        self.context = zmq.asyncio.Context()
        self.topic = settings.kv_events_topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.kv_events_buffer_steps)
        self.next_seq = 0
        self.pub = self.context.socket(zmq.PUB)
        self.pub.set_hwm(HWM)
        self.pub.bind(settings.kv_events_endpoint)
        self.replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        if settings.kv_events_replay_endpoint is not None:
            self.replay = self.context.socket(zmq.ROUTER)
            self.replay.bind(settings.kv_events_replay_endpoint)
            self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="sim-kv-replay")

    def publish(self, events: list[KvEvent]) -> None:
        """One step's events as one batch (nothing for a step that changed nothing)."""
        if not events:
            return
        seq, payload = self.next_seq, encode_batch(KVEventBatch(time.time(), events))
        self.next_seq += 1
        self.buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # a slow subscriber past the mark loses it, as with vLLM
            self.pub.send_multipart((self.topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                _log.warning("a replay request of %d frames (want: identity, empty, start sequence)", len(frames))
                continue
            client, _, start = frames
            first = seq_of(start)
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart((client, b"", self.topic, seq_bytes(seq), payload))
            await self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
        self.context.term()
