"""zerogap: one key in front of a pool of tuned LLM engines."""

__version__ = "0.1.0"
