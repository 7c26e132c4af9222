"""common: what every zerogap package shares, and nothing else of ours.

config (config.toml's models), net (ports, readiness), promtext (Prometheus text), argtypes
(argument types), commands (the `zerogap ...` child command), html_page (the HTML page shell),
openai_request (the rules of an OpenAI request, read by the gateway and the sim), process_group
(each supervised child leads its own process group), supervisor (the supervisor of gateway workers
and backend replicas). It imports no other package of ours (tests/test_structure.py checks it).
"""

__version__ = "0.1.0"
