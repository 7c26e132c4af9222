"""zerogap: one key in front of a pool of tuned LLM engines.

This package holds two layers (tests/test_structure.py checks both rules):

- the ground, shared by gateway/, backends/, loadtest/, loadreport/ and loadgen/: config
  (config.toml's models), net (ports, readiness), promtext (Prometheus text), argtypes
  (argument types), commands (the `zerogap ...` child command), html_page (the HTML page
  shell), openai_request (the rules of an OpenAI request, read by the gateway and the sim),
  process_group (each supervised child leads its own process group), supervisor (the
  supervisor of gateway workers and backend replicas) and this file. It imports nothing
  else of ours.
- the roof, the commands that put the packages together: cli and __main__ (the
  dispatcher), demo and demo_stack, interrupts, locust_run, tune. It may import anything;
  nothing below it (gateway/, backends/, loadtest/, loadreport/, loadgen/) imports it.
"""

__version__ = "0.1.0"
