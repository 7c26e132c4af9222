"""The stepped plan: warm-up, steps, measured windows, the shape's ticks and open-loop rates."""

from __future__ import annotations

from loadreport.schedule import LoadSchedule
from loadreport.settings import LoadTestSection


def test_no_steps_is_the_articles_plan() -> None:
    """The article's load_test (no steps): 30 s warm-up at 128 users, then 300 s at 128, all measured."""
    plan = LoadSchedule.from_settings(LoadTestSection())
    assert [(p.index, p.load, p.start_s, p.end_s, p.measure_start_s) for p in plan.phases] == [
        (-1, 128, 0, 30, 30),
        (0, 128, 30, 330, 30),
    ]
    assert plan.tick(0) == (128, 128.0) and plan.tick(329) == (128, 128.0) and plan.tick(330) is None


def test_stepped_plan() -> None:
    plan = LoadSchedule.from_settings(LoadTestSection(steps=[32, 128, 256]))
    assert [(p.index, p.load, p.start_s, p.end_s, p.measure_start_s) for p in plan.phases] == [
        (-1, 32, 0, 30, 30),
        (0, 32, 30, 210, 90),
        (1, 128, 210, 390, 270),
        (2, 256, 390, 570, 450),
    ]
    assert plan.tick(0) == (32, 32.0)
    assert plan.tick(215) == (128, 128.0)
    assert plan.tick(570) is None


def test_no_steps_is_one_step_at_concurrency_measured_whole() -> None:
    plan = LoadSchedule.from_settings(LoadTestSection(steps=[], concurrency=8, duration_seconds=60, warmup_seconds=0))
    assert [(p.index, p.load, p.start_s, p.end_s, p.measure_start_s) for p in plan.phases] == [(0, 8, 0, 60, 0)]


def test_open_loop_steps_are_rates_and_users_stay_at_concurrency() -> None:
    load = LoadTestSection(request_rate=5, steps=[2.5, 10], concurrency=16, warmup_seconds=0, step_duration_seconds=10,
                           measure_last_seconds=5)  # fmt: skip
    plan = LoadSchedule.from_settings(load)
    assert plan.open_loop
    assert plan.rate_at(1) == 2.5 and plan.rate_at(12) == 10 and plan.rate_at(25) == 0
    assert plan.tick(12) == (16, 16.0)


def test_prompt_calibration_with_a_tokenizer_and_without() -> None:
    from loadgen.prompt import calibrate

    def two_per_word(text: str) -> int:  # a tokenizer that splits every word in two
        return 2 * len(text.split())

    text, how = calibrate(100, two_per_word, prefix="000000 ")
    assert how == "tokenize" and two_per_word("000000 " + text) == 100
    text, how = calibrate(100, None, prefix="000000 ")
    assert how == "approx" and len(text.split()) == 99
    assert calibrate(10, lambda _: None)[1] == "approx"
