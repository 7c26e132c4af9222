import pytest

from backends.sim.engine.cost_model import CostModel
from backends.sim.engine.scheduler import Batch
from backends.sim.settings import SimSettings


def _decode_batch(num_seqs: int, num_changed: int = 0) -> Batch:
    return Batch(items=[(None, 1)] * num_seqs, num_decode_seqs=num_seqs, num_changed=num_changed)  # type: ignore[list-item]


def _model(**flags) -> CostModel:
    return CostModel(SimSettings().with_flags(**flags))


def test_baseline_at_256_interval_about_equals_forward():
    cost = _model(async_scheduling=False, slot_reuse=False).step(_decode_batch(256))
    assert cost.forward_s == pytest.approx(0.035, rel=0.05)
    assert cost.interval_s == pytest.approx(0.035, rel=0.05)
    assert cost.duration_s == pytest.approx(cost.forward_s + cost.interval_s)


def test_slot_reuse_interval_grows_only_with_changed_requests():
    model = _model(async_scheduling=False, slot_reuse=True)
    steady = model.step(_decode_batch(256, num_changed=2))
    assert steady.interval_s == pytest.approx(0.014, rel=0.08)
    churn = model.step(_decode_batch(256, num_changed=64))
    assert churn.interval_s - steady.interval_s == pytest.approx(62 * 0.082e-3)


def test_async_takes_the_max_not_the_sum():
    cost = _model(async_scheduling=True, slot_reuse=False).step(_decode_batch(256))
    assert cost.duration_s == pytest.approx(max(cost.forward_s, cost.interval_s) + 0.0005)
    assert cost.forward_s / cost.duration_s >= 0.95


def test_detokenizer_async_saves_about_ten_percent_of_the_interval():
    inline = _model(async_scheduling=False, slot_reuse=False, detokenizer_async=False).step(_decode_batch(256))
    split = _model(async_scheduling=False, slot_reuse=False, detokenizer_async=True).step(_decode_batch(256))
    assert 1 - split.interval_s / inline.interval_s == pytest.approx(0.10, abs=0.02)


def test_time_scale_multiplies_every_time():
    one = _model(time_scale=1.0).step(_decode_batch(100, 3))
    ten = _model(time_scale=10.0).step(_decode_batch(100, 3))
    assert ten.forward_s == pytest.approx(10 * one.forward_s)
    assert ten.interval_s == pytest.approx(10 * one.interval_s)
    assert ten.duration_s == pytest.approx(10 * one.duration_s)


def test_prefill_tokens_cost_forward_time():
    model = _model()
    batch = Batch(items=[(None, 512)], num_prefill_tokens=512, num_changed=1)  # type: ignore[list-item]
    assert model.step(batch).forward_s == pytest.approx(0.005 + 512 * 0.01e-3)
