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

from backends.sim.block_manager import BlockManager
from backends.sim.sequence import SeqStatus, Sequence


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


@dataclass(frozen=True, slots=True)
class TokenEvent:
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
        blocks = self.blocks
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed, budget)
            while not blocks.can_allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                batch.num_preempted += 1
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            blocks.allocate(seq, num_new)
            self._add_item(batch, seq, num_new)
            budget -= num_new
            i += 1
        return budget

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
        for seq, num_new in batch.items:
            if seq.status is not SeqStatus.RUNNING:
                continue  # aborted or preempted while the step ran
            seq.num_computed_tokens += num_new
            blocks.on_computed(seq)
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk: no token yet
            token = sample(seq)
            seq.append_token(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.running.remove(seq)
                self.num_removed += 1
                self._finish(seq, reason)
            events.append(TokenEvent(seq, token, reason is not None))
        return events

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        if token in seq.stop_ids:
            return "stop"
        if seq.eos_at is not None and not seq.ignore_eos and seq.num_output_tokens >= seq.eos_at:
            return "stop"
        return None
