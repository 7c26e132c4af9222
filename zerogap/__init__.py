"""zerogap: one key in front of a pool of tuned LLM engines.

This package holds two layers (tests/test_structure.py checks both rules):

- the ground, shared by gateway/, backends/ and loadtest/: config (config.toml's
  models), net (ports, readiness), promtext (Prometheus text), argtypes (argument
  types), commands (the `zerogap ...` child command), html_page (the HTML page shell)
  and this file. It imports nothing else of ours.
- the roof, the commands that put the packages together: cli and __main__ (the
  dispatcher), demo and demo_stack, locust_run, tune. It may import anything;
  gateway/, backends/ and loadtest/ never import it.
"""

__version__ = "0.1.0"
