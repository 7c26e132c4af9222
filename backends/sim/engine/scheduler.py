"""A continuous-batching scheduler, free of I/O (nano-vllm / vLLM V1 style).

schedule() picks this step's batch: running sequences first (decodes and unfinished
prefill chunks), oldest first, then waiting ones in FCFS order, within max_num_seqs
and the max_num_batched_tokens budget; a prompt longer than the budget is split in
chunks (chunked prefill). When a running sequence needs a KV block and none is free,
the newest running sequence is preempted (recompute: blocks freed, back to the head
of the waiting queue). postprocess() applies the step: computed tokens, sampled
tokens, finished sequences.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from backends.sim.engine.block_manager import BlockManager
from backends.sim.engine.sequence import SeqStatus, Sequence


@dataclass(slots=True)
class Batch:
    """What one step computes: (sequence, number of its tokens computed this step)."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    num_decode_seqs: int = 0
    num_prefill_tokens: int = 0
    num_changed: int = 0  # sequences added to or removed from the batch since the last step
    num_preempted: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.items)

    @property
    def num_tokens(self) -> int:
        return self.num_decode_seqs + self.num_prefill_tokens


class TokenEvent(NamedTuple):
    """A sequence's new token after a step; finished tells whether it was its last."""

    seq: Sequence
    token: int
    finished: bool


SampleFn = Callable[[Sequence], int]


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_removed = 0  # removed from the running batch since the last schedule()
        self.num_preemptions_total = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Remove a sequence wherever it is and free its blocks (client went away)."""
        if seq.finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.num_removed += 1
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.blocks.release(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_removed += 1
        self.num_preemptions_total += 1

    def schedule(self) -> Batch:
        batch = Batch(num_changed=self.num_removed)
        self.num_removed = 0
        budget = self._schedule_running(batch, self.max_num_batched_tokens)
        if batch.num_preempted == 0:
            self._schedule_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        """The hot path (every running sequence, every step): attributes, not properties."""
        blocks, running, items = self.blocks, self.running, batch.items
        size, free = blocks.block_size, blocks.free
        num_decode = num_prefill = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            num_new = min(len(seq.token_ids) - computed, budget)
            need = (computed + num_new + size - 1) // size - len(seq.block_table)
            if need > len(free) and not self._make_room(batch, seq, need):
                break  # seq itself was preempted
            if need > 0:
                blocks.allocate(seq, num_new)
            items.append((seq, num_new))
            if num_new == 1 and computed >= len(seq.prompt_token_ids):
                num_decode += 1
            else:
                num_prefill += num_new
            budget -= num_new
            i += 1
        batch.num_decode_seqs += num_decode
        batch.num_prefill_tokens += num_prefill
        return budget

    def _make_room(self, batch: Batch, seq: Sequence, need: int) -> bool:
        """Preempt the newest running sequences until seq's blocks fit; False if seq went."""
        while need > self.blocks.num_free:
            victim = self.running[-1]
            self._preempt(victim)
            batch.num_preempted += 1
            if victim is seq:
                return False
        return True

    def _schedule_waiting(self, batch: Batch, budget: int) -> None:
        blocks = self.blocks
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = blocks.match_prefix(seq)
            num_new = seq.num_tokens - len(hits) * blocks.block_size
            if num_new > budget:
                if not self.enable_chunked_prefill and (batch.items or num_new <= self.max_num_batched_tokens):
                    break
                num_new = budget
            size = blocks.block_size
            new_blocks = -(-(len(hits) * size + num_new) // size) - len(hits)
            if new_blocks > blocks.num_free - self._free_hits(hits):
                break
            blocks.take_prefix(seq, hits)
            blocks.allocate(seq, num_new)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self._add_item(batch, seq, num_new)
            batch.num_changed += 1
            budget -= num_new

    def _free_hits(self, hits: list[int]) -> int:
        """Hit blocks that sit in the free list: taking them shrinks it."""
        return sum(1 for block in hits if self.blocks.ref_count[block] == 0)

    @staticmethod
    def _add_item(batch: Batch, seq: Sequence, num_new: int) -> None:
        batch.items.append((seq, num_new))
        if seq.is_decoding:
            batch.num_decode_seqs += 1
        else:
            batch.num_prefill_tokens += num_new

    def postprocess(self, batch: Batch, sample: SampleFn) -> list[TokenEvent]:
        """Apply a computed step: advance each sequence and sample where it is complete."""
        events: list[TokenEvent] = []
        blocks = self.blocks
        size = blocks.block_size
        caching = blocks.enable_prefix_caching
        max_len = self.max_model_len
        running = SeqStatus.RUNNING
        for seq, num_new in batch.items:
            if seq.status is not running:
                continue  # aborted or preempted while the step ran
            computed = seq.num_computed_tokens + num_new
            seq.num_computed_tokens = computed
            if caching and computed // size > seq.num_hashed_blocks:
                blocks.on_computed(seq)
            if computed < len(seq.token_ids):
                continue  # a prefill chunk: no token yet
            token = sample(seq)
            seq.token_ids.append(token)
            seq.output_token_ids.append(token)
            reason = self._stop_reason(seq, token, max_len)
            if reason is not None:
                self.running.remove(seq)
                self.num_removed += 1
                self._finish(seq, reason)
            events.append(TokenEvent(seq, token, reason is not None))
        return events

    @staticmethod
    def _stop_reason(seq: Sequence, token: int, max_model_len: int) -> str | None:
        if len(seq.output_token_ids) >= seq.max_tokens or len(seq.token_ids) >= max_model_len:
            return "length"
        if seq.stop_ids and token in seq.stop_ids:
            return "stop"
        if seq.eos_at is not None and not seq.ignore_eos and len(seq.output_token_ids) >= seq.eos_at:
            return "stop"
        return None
