"""Routing policies behind one interface (policy.py): least_load, round_robin, cache_aware
(rendezvous.py: the same decision in every process) and cache_aware_local (affinity.py:
per-process prefix tables); registry.py names them. Pure, no I/O."""
