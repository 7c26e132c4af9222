"""vLLM's KV-cache event wire format (vllm/distributed/kv_events.py in 0.32), shared by the sim's
publisher and the gateway's subscriber.

A ZeroMQ PUB socket sends one multipart message per engine step: (topic, the batch's sequence
number as 8 bytes big-endian, a msgpack KVEventBatch). The batch is an array [ts, events,
data_parallel_rank]; each event a map tagged by its class name in a `type` field: BlockStored
(the chained hashes of newly cached full blocks, the hash of the block before the first, their
token ids, the block size), BlockRemoved (evicted hashes), AllBlocksCleared. A ROUTER socket
(the replay endpoint) answers a request (an empty frame, then a start sequence number as 8 bytes
big-endian) with every buffered batch from that number on, as (client id, b"", topic, seq,
payload) each, then (client id, b"", b"", -1 as 8 bytes signed, b"").

vLLM's hashes are SHA-256 over pickled (parent hash, token ids, extra keys), sent as their low 64
bits (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default) or as 32 bytes; a consumer needs only
their identity, since BlockStored also carries the token ids.
"""

from __future__ import annotations

from typing import Any

import msgspec

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's last message
MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """The base of the events (tagged by class name, as vLLM's)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """One batch; msgspec.DecodeError (a ValueError) for bytes that are not one."""
    return _DECODER.decode(payload)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
