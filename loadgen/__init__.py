"""A load test's live side, under Locust and gevent: the harness behind loadtest/locustfile.py
(harness.py), the streaming client and SSE parser, prompts and workloads, open-loop arrivals,
retries and fail-fast, the backend scrapes and the timeline sampler, Locust worker links, the web
UI tab, the Prometheus exporter and the progress lines. What a run's figures become is
loadreport/. Importing this package itself loads nothing; its modules load gevent as they need.
"""
