from backends.sim.engine.core import EngineCore
from backends.sim.settings import SimSettings


def _drain(core: EngineCore, limit: int = 10_000) -> None:
    for _ in range(limit):
        step = core.next_step()
        if step is None:
            return
        core.finish(step)


def test_eos_probability_ends_requests_early_unless_ignore_eos():
    core = EngineCore(SimSettings().with_flags(eos_probability=0.2, seed=3))
    natural = [core.new_sequence([100 + i], 200, 0.0) for i in range(50)]
    forced = [core.new_sequence([300 + i], 200, 0.0, ignore_eos=True) for i in range(5)]
    for seq in natural + forced:
        core.add(seq)
    _drain(core)
    lengths = [seq.num_output_tokens for seq in natural]
    assert all(seq.finish_reason == "stop" for seq in natural if seq.num_output_tokens < 200)
    assert 2 < sum(lengths) / len(lengths) < 10  # geometric with p = 0.2: mean 5
    assert all(seq.num_output_tokens == 200 and seq.finish_reason == "length" for seq in forced)


def test_default_model_never_stops_before_max_tokens():
    core = EngineCore(SimSettings())
    seqs = [core.new_sequence([7, 8, 9], 30, 0.0) for _ in range(4)]
    for seq in seqs:
        core.add(seq)
    _drain(core)
    assert [s.num_output_tokens for s in seqs] == [30] * 4
