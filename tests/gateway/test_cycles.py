"""Serving leaves no reference cycles behind: every object of a request is freed by reference
counting the moment the request ends. The gateway runs the collector's full pass rarely
(gateway/cli.py's thresholds), so a cycle per request grows RSS for minutes (the soak read +26 %
in 2 minutes when each streamed request left one).

The soak's request mix (streams, whole answers, client hang-ups, upstream 500s and resets, bad
requests) runs through a real gateway with the collector saving what it finds; no object of
the gateway's own modules may be among it."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections import Counter

from bench.soak_load import KEY, MODEL, Tally, run_clients
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, make_config

NUM_CLIENTS = 24
DURATION_S = 6.0


def gateway_garbage() -> Counter[str]:
    """The gateway's objects among what the collector finds unreachable (and saves) now."""
    gc.collect()
    found = Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage if type(o).__module__.startswith("gateway.")
    )
    gc.garbage.clear()
    return found


async def test_the_soak_mix_leaves_no_reference_cycle(tmp_path) -> None:
    behavior = Behavior(ttft_s=0.01, interval_s=0.01)
    with UpstreamServer(behavior, model=MODEL) as a, UpstreamServer(behavior, model=MODEL) as b:
        config = make_config(tmp_path, [("a", a.url, MODEL), ("b", b.url, MODEL)], api_key=KEY)
        with GatewayServer(config) as gs:
            tally = Tally(time.monotonic())
            await run_clients(gs.url, 2, time.monotonic() + 1.0, random.Random(0), lambda: tally)  # warm up
            gc.collect()
            gc.garbage.clear()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                end_s = time.monotonic() + DURATION_S
                await run_clients(gs.url, NUM_CLIENTS, end_s, random.Random(1), lambda: tally)
                await asyncio.sleep(0.2)  # the gateway's side of the last requests ends
                found = gateway_garbage()
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert tally.num_good_failed == 0 and tally.num_hung == 0, tally.examples
    assert len(tally.by_kind) == 6 and tally.num_requests > 100, tally.summary()  # every kind ran
    assert not found, f"freed only by the cycle collector after {tally.num_requests} requests: {found.most_common(8)}"
