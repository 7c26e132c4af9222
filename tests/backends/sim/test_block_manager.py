from backends.sim.engine.block_manager import BlockManager
from backends.sim.engine.sequence import Sequence


def _seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, tokens, max_tokens=8)


def test_allocation_respects_capacity():
    blocks = BlockManager(num_blocks=4, block_size=4)
    seq = _seq(0, list(range(10)))
    assert blocks.blocks_needed(seq, 10) == 3
    assert blocks.can_allocate(seq, 10)
    blocks.allocate(seq, 10)
    assert len(seq.block_table) == 3
    assert blocks.num_free == 1
    other = _seq(1, list(range(100, 108)))
    assert not blocks.can_allocate(other, 8)
    blocks.release(seq)
    assert blocks.num_free == 4
    assert blocks.usage == 0.0


def test_full_blocks_are_found_again_after_release():
    blocks = BlockManager(num_blocks=8, block_size=4)
    first = _seq(0, list(range(10)))
    blocks.allocate(first, 10)
    first.num_computed_tokens = 10
    blocks.on_computed(first)
    blocks.release(first)
    # same first 8 tokens, different tail: two full blocks hit
    second = _seq(1, [*range(8), 99, 98, 97])
    hits = blocks.match_prefix(second)
    assert len(hits) == 2
    blocks.take_prefix(second, hits)
    assert second.num_computed_tokens == 8
    assert second.num_cached_tokens == 8
    assert blocks.num_hits == 8


def test_a_fully_cached_prompt_still_computes_its_last_token():
    blocks = BlockManager(num_blocks=8, block_size=4)
    first = _seq(0, list(range(8)))
    blocks.allocate(first, 8)
    first.num_computed_tokens = 8
    blocks.on_computed(first)
    blocks.release(first)
    hits = blocks.match_prefix(_seq(1, list(range(8))))
    assert len(hits) == 1  # the block holding the last token is recomputed


def test_reused_free_block_loses_its_hash():
    blocks = BlockManager(num_blocks=2, block_size=4)
    first = _seq(0, list(range(8)))
    blocks.allocate(first, 8)
    first.num_computed_tokens = 8
    blocks.on_computed(first)
    blocks.release(first)
    filler = _seq(1, list(range(50, 58)))
    blocks.allocate(filler, 8)  # takes both free blocks, evicting the cached prefix
    blocks.release(filler)
    assert blocks.match_prefix(_seq(2, [*range(8), 1])) == []


def test_prefix_caching_off_never_hits():
    blocks = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first = _seq(0, list(range(9)))
    blocks.allocate(first, 9)
    first.num_computed_tokens = 9
    blocks.on_computed(first)
    blocks.release(first)
    assert blocks.match_prefix(_seq(1, list(range(9)))) == []


def test_hit_rate_counts_each_admission_once_as_vllm_does():
    blocks = BlockManager(num_blocks=8, block_size=4)
    first = _seq(0, list(range(10)))
    blocks.take_prefix(first, blocks.match_prefix(first))
    blocks.allocate(first, 10)
    first.num_computed_tokens = 10
    blocks.on_computed(first)
    blocks.release(first)
    second = _seq(1, [*range(8), 99, 98])
    for _ in range(3):
        hits = blocks.match_prefix(second)  # looked up while it waits: not counted yet
    blocks.take_prefix(second, hits)
    assert (blocks.num_queries, blocks.num_hits) == (20, 8)
    blocks.release(second)
    second.num_preemptions = 1  # preempted, admitted again: not a new query
    blocks.take_prefix(second, blocks.match_prefix(second))
    assert (blocks.num_queries, blocks.num_hits) == (20, 8)
