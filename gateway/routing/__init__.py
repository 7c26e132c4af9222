"""Routing policies that need more than a backend's load: cache-aware routing (pure, no I/O)."""
