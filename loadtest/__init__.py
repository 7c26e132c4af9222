"""The stepped Locust harness for TPS, TTFT, TPOT and GPU utilization.

`locust -f loadtest/` loads only loadtest/locustfile.py: every other module's name
starts with `_`, so Locust skips it and sees one user class and one shape.
"""
