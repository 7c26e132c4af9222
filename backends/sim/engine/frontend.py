"""The engine's API server, modelled as one first-come-first-served server in front of it.

vLLM's API server is one Python process: it parses each request (and renders its chat
template and tokenizes it) before the engine sees it, and turns each token the engine
makes into an SSE event on the client's socket. On a small machine, or with a tiny model
whose steps take well under a millisecond, that process, not the engine, caps the tokens
per second: requests wait outside the engine (its running + waiting gauges hold fewer
than the users in flight) and tokens reach the client in bursts.

    a request reaches the engine  at  max(sent, server free) + frontend_per_request
    a token reaches the client    at  max(made, server free) + frontend_per_token

Both [sim] costs 0 (the default): no frontend, every time as the engine makes it. Pure
arithmetic on times handed in: the virtual engine (virtual.py) and the served one
(engine.py) both drive it. `zerogap sim calibrate` sets the costs from the runs (fit_terms.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.settings import SimSettings


@dataclass(slots=True)
class Frontend:
    per_request_s: float
    per_token_s: float
    free_at_s: float = 0.0  # when the server has done everything handed to it so far
    busy_s: float = 0.0  # its total service time (for its busy share)

    @classmethod
    def of(cls, settings: SimSettings) -> Frontend | None:
        """The settings' frontend; None where both costs are 0 (times pass through unchanged)."""
        c = settings.cost
        if c.frontend_per_request_ms <= 0 and c.frontend_per_token_ms <= 0:
            return None
        ms = settings.time_scale / 1000.0
        return cls(c.frontend_per_request_ms * ms, c.frontend_per_token_ms * ms)

    def _serve(self, t_s: float, cost_s: float) -> float:
        done = max(t_s, self.free_at_s) + cost_s
        self.free_at_s = done
        self.busy_s += cost_s
        return done

    def admit(self, sent_s: float) -> float:
        """When a request the client sent at sent_s reaches the engine."""
        return self._serve(sent_s, self.per_request_s)

    def deliver(self, made_s: float) -> float:
        """When a token the engine made at made_s reaches the client."""
        return self._serve(made_s, self.per_token_s)
