from backends.sim.engine.block_manager import BlockManager
from backends.sim.engine.scheduler import Scheduler
from backends.sim.engine.sequence import SeqStatus, Sequence


def _sample(seq: Sequence) -> int:
    return 1


def _scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, chunked=True, max_model_len=1024):
    blocks = BlockManager(num_blocks, block_size)
    return Scheduler(blocks, max_num_seqs, budget, max_model_len, enable_chunked_prefill=chunked)


def _seq(seq_id: int, num_prompt: int, max_tokens: int = 4, base: int = 0) -> Sequence:
    return Sequence(seq_id, [base + seq_id * 1000 + i for i in range(num_prompt)], max_tokens)


def test_fcfs_and_max_num_seqs():
    sched = _scheduler(max_num_seqs=2)
    seqs = [_seq(i, 4) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    batch = sched.schedule()
    assert [s.seq_id for s, _ in batch.items] == [0, 1]
    assert batch.num_prefill_tokens == 8 and batch.num_decode_seqs == 0
    assert batch.num_changed == 2
    events = sched.postprocess(batch, _sample)
    assert [e.seq.seq_id for e in events] == [0, 1]
    batch = sched.schedule()
    assert batch.num_decode_seqs == 2 and batch.num_changed == 0
    assert list(sched.waiting) == [seqs[2]]


def test_chunked_prefill_splits_a_long_prompt_over_steps():
    sched = _scheduler(budget=16)
    seq = _seq(0, 40, max_tokens=2)
    sched.add(seq)
    sizes = []
    for _ in range(3):
        batch = sched.schedule()
        sizes.append(batch.items[0][1])
        events = sched.postprocess(batch, _sample)
        assert (events != []) == (sum(sizes) == 40)
    assert sizes == [16, 16, 8]
    assert seq.num_output_tokens == 1


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched = _scheduler(budget=16, chunked=False)
    sched.add(_seq(0, 10))
    sched.add(_seq(1, 10))
    batch = sched.schedule()
    assert [s.seq_id for s, _ in batch.items] == [0]  # 10 + 10 > 16: the second waits


def test_decode_budget_and_finish_by_length():
    sched = _scheduler()
    seq = _seq(0, 4, max_tokens=3)
    sched.add(seq)
    finished = []
    for _ in range(5):
        batch = sched.schedule()
        if not batch.items:
            break
        finished += [e for e in sched.postprocess(batch, _sample) if e.finished]
    assert seq.num_output_tokens == 3
    assert seq.finish_reason == "length"
    assert seq.status is SeqStatus.FINISHED
    assert len(finished) == 1
    assert sched.blocks.num_free == sched.blocks.num_blocks


def test_request_that_does_not_fit_waits():
    sched = _scheduler(num_blocks=4, block_size=4, budget=64)
    sched.add(_seq(0, 12))  # 3 blocks
    sched.add(_seq(1, 8))  # 2 blocks: only 1 left
    batch = sched.schedule()
    assert [s.seq_id for s, _ in batch.items] == [0]
    assert len(sched.waiting) == 1


def test_decode_out_of_blocks_preempts_the_newest():
    sched = _scheduler(num_blocks=4, block_size=4, budget=64, max_num_seqs=4)
    old, new = _seq(0, 8, max_tokens=10), _seq(1, 8, max_tokens=10)
    sched.add(old)
    sched.add(new)
    sched.postprocess(sched.schedule(), _sample)  # both prefilled: 4 blocks used, each has 9 tokens
    batch = sched.schedule()  # each needs a third block for token 9: none free
    assert batch.num_preempted == 1
    assert new.status is SeqStatus.WAITING and new.num_computed_tokens == 0
    assert new.num_preemptions == 1
    assert [s.seq_id for s, _ in batch.items] == [0]
    assert sched.waiting[0] is new
    assert sched.num_preemptions_total == 1
    sched.postprocess(batch, _sample)
    assert old.num_output_tokens == 2


def test_prefix_caching_skips_the_shared_prefix():
    sched = _scheduler(block_size=4, budget=64)
    shared = list(range(500, 516))  # 4 full blocks
    first = Sequence(0, [*shared, 1, 2], max_tokens=1)
    sched.add(first)
    sched.postprocess(sched.schedule(), _sample)
    assert first.finished
    second = Sequence(1, [*shared, 3, 4], max_tokens=1)
    sched.add(second)
    batch = sched.schedule()
    assert batch.items[0][1] == 2  # only the 2 new tokens are prefilled
    assert second.num_cached_tokens == 16


def test_abort_frees_slot_and_blocks():
    sched = _scheduler(max_num_seqs=1)
    running, waiting = _seq(0, 8, max_tokens=100), _seq(1, 8)
    sched.add(running)
    sched.add(waiting)
    batch = sched.schedule()
    sched.abort(running)
    assert sched.postprocess(batch, _sample) == []  # the aborted seq's step is dropped
    assert running.finish_reason == "abort"
    assert sched.blocks.num_free == sched.blocks.num_blocks
    batch = sched.schedule()
    assert [s.seq_id for s, _ in batch.items] == [1]
    assert batch.num_changed == 2  # one left the batch, one joined


def test_stop_word_and_max_model_len():
    sched = _scheduler(max_model_len=10)
    seq = Sequence(0, list(range(8)), max_tokens=100)
    sched.add(seq)
    for _ in range(5):
        batch = sched.schedule()
        if not batch.items:
            break
        sched.postprocess(batch, _sample)
    assert seq.num_tokens == 10 and seq.finish_reason == "length"
    sched2 = _scheduler()
    stopper = Sequence(1, [5, 6], max_tokens=100, stop_ids=frozenset({1}))
    sched2.add(stopper)
    sched2.postprocess(sched2.schedule(), _sample)
    assert stopper.finish_reason == "stop" and stopper.num_output_tokens == 1
