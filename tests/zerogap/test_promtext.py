from common.promtext import iter_samples, sum_samples, sums_by_name

PAGE = """# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0 1712345678000
zerogap_requests_total{key="a b}c",status="200"} 5
plain_gauge 1.5
garbage
half{engine="0"
bad_value{engine="0"} x
"""


def test_sums_over_label_sets_and_ignores_timestamps() -> None:
    assert sums_by_name(PAGE, {"vllm:num_requests_running", "vllm:num_requests_waiting"}) == {
        "vllm:num_requests_running": 7.0,
        "vllm:num_requests_waiting": 2.0,
    }


def test_label_filter_and_absent_series() -> None:
    assert sum_samples(PAGE, "vllm:num_requests_running", {"engine": "1"}) == 4.0
    assert sum_samples(PAGE, "zerogap_requests_total", {"key": "a b}c"}) == 5.0
    assert sum_samples(PAGE, "plain_gauge") == 1.5
    assert sum_samples(PAGE, "vllm:num_requests_running", {"engine": "9"}) is None
    assert sum_samples(PAGE.encode(), "no_such_series") is None


def test_bad_lines_are_skipped_not_raised() -> None:
    names = [s.name for s in iter_samples(PAGE)]
    assert "garbage" not in names and "half" not in names and "bad_value" not in names
    assert len(names) == 5
