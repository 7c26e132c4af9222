"""zerogap: one key in front of a pool of tuned LLM engines.

This package is the roof: the commands that put the packages together: cli and __main__ (the
dispatcher), demo and demo_stack, interrupts, locust_run, tune. It may import anything; nothing
below it (gateway/, backends/, loadtest/, loadreport/, loadgen/, common/) imports it. What they
all share is common/ (tests/test_structure.py checks both rules).
"""

from common import __version__

__all__ = ["__version__"]
