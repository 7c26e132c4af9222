"""One request inside the engine: its tokens, its KV blocks and how far it has been computed."""

from __future__ import annotations

from enum import Enum


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens = prompt + output. Each step computes some of the not-yet-computed tokens;
    when all are computed, the step samples one new output token (vLLM V1 semantics)."""

    __slots__ = (
        "arrival_s",
        "block_table",
        "eos_at",
        "finish_reason",
        "ignore_eos",
        "last_block_hash",
        "max_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_hashed_blocks",
        "num_preemptions",
        "output_token_ids",
        "prompt_token_ids",
        "seq_id",
        "status",
        "stop_ids",
        "token_ids",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: list[int],
        max_tokens: int,
        arrival_s: float = 0.0,
        ignore_eos: bool = False,
        stop_ids: frozenset[int] = frozenset(),
        eos_at: int | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.seq_id = seq_id
        self.prompt_token_ids = prompt_token_ids
        self.token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.ignore_eos = ignore_eos
        self.stop_ids = stop_ids
        self.eos_at = eos_at  # output length at which the synthetic model emits EOS
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0  # leading blocks whose hash the block manager has registered
        self.last_block_hash = 0
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to compute."""
        return self.num_uncomputed == 1 and self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, {self.status.value}, computed={self.num_computed_tokens}/{self.num_tokens})"
