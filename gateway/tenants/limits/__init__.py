"""Per-key limits: requests/min (rpm), tokens/min (tpm) and requests in flight (max_concurrency).

One rule (rule.py: head_rule, tpm_rule), three places that keep the counts, each behind the
Limiter interface (base.py): this process's memory (memory.py), the workers' shared SQLite file
(sqlite.py) and Redis (redis.py, which runs the same rule in Lua: redis_lua.py, checked against
rule.py by tests/gateway/test_refill_rates.py).

At the headers, before the body is read (`admit`): one request from the rpm bucket (rpm
requests, refilled at rpm/60 per second) and one concurrency slot, both or neither. A slot is
held until the request really ends (`release`, in a finally); in the shared file and Redis it is
a lease that its process renews, so that a process that dies cannot hold it for longer than
[gateway].concurrency_lease_s.

After the body is parsed (`reserve`): the tpm bucket (tpm tokens, refilled at tpm/60 per
second) must hold the request's whole estimate (prompt bytes / 4 + its completion budget); the
estimate is then taken, and when the request ends it is replaced by what the request used
(`settle`). An estimate larger than the whole bucket could never be admitted: 400 at once,
saying which max_tokens would fit, rather than a 429 that no wait would clear.

Every figure is clamped to MAX_COUNT before it meets a float, so no integer a client, a key or
a backend brings can overflow a bucket.
"""

from __future__ import annotations

from gateway.tenants.limits.base import Limiter, Slot, limited_at_head
from gateway.tenants.limits.rule import MAX_COUNT, estimate_tokens

__all__ = ["MAX_COUNT", "Limiter", "Slot", "estimate_tokens", "limited_at_head"]
