"""Which [sim] terms a set of runs can pin down, and what is assumed for the others.

A term is a group of [sim] fields scaled together by one fitted factor: fields that the
data only ever sees as a sum (the forward and the interval without a GPU-busy signal;
the two per-sequence interval terms without slot reuse) are one term, split in the
proportion CONFIG gives them. Every decision is said in a note.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.calibrate.runs import ENGINE_TTFT_MIN_SHARE, OUTSIDE_MIN, Observation, engine_ttft_ms, gauges_read
from backends.sim.settings import SimSettings
from common.config.sim import SimSection

ASSUMED_CLIENT_GAP_MS = 1.0  # a load generator on the engine's host or LAN, in real ms


@dataclass(frozen=True, slots=True)
class Term:
    fields: tuple[str, ...]

    @property
    def name(self) -> str:
        return " + ".join(self.fields)


@dataclass
class TermChoice:
    """What the fit varies (terms), what it sets without fitting (fixed) and why (notes)."""

    terms: list[Term]
    notes: list[str]
    fixed: dict[str, float]  # fields set (not fitted) by the choice, e.g. an assumed client gap


def choose_terms(settings: SimSettings, observations: list[Observation]) -> TermChoice:
    c = settings.cost
    has_busy = any(o.gpu_busy is not None for o in observations)
    has_cpu = any(o.cpu_interval_ms is not None for o in observations)
    timed, ttft_note = _timed(observations)
    has_ttft = bool(timed)
    prompts = sorted({o.prompt_tokens for o in timed})
    notes: list[str] = []
    fixed: dict[str, float] = {}
    per_seq = _per_seq_interval(settings, notes)
    split = has_busy or has_cpu
    terms: list[Term] = []
    if settings.async_scheduling:
        terms += [Term(("forward_fixed_ms",)), Term(("forward_per_seq_ms",))]
        if has_busy:
            terms.append(Term(("async_overhead_ms",)))
        else:
            terms[0] = Term(("forward_fixed_ms", "async_overhead_ms"))
            notes.append(
                "no GPU-busy signal: the forward's fixed part and async_overhead_ms add up in every step; "
                f"fitted as one, split as in CONFIG ({c.forward_fixed_ms:g} : {c.async_overhead_ms:g})"
            )
        if has_cpu:
            terms += [Term(("interval_fixed_ms",)), Term(per_seq)]
        else:
            notes.append(
                "async scheduling hides the CPU interval behind the forward and the runs have no CPU-interval "
                "signal (zerogap_sim_cpu_interval_seconds): interval_* kept as in CONFIG (they matter only where "
                "the CPU work outgrows the forward)"
            )
    elif split:
        terms += [Term(("forward_fixed_ms",)), Term(("forward_per_seq_ms",))]
        terms += [Term(("interval_fixed_ms",)), Term(per_seq)]
    else:
        terms += [Term(("forward_fixed_ms", "interval_fixed_ms")), Term(("forward_per_seq_ms", *per_seq))]
        notes.append(
            "no GPU-busy signal: with synchronous scheduling a step is forward + interval, so they cannot be "
            f"split; fitted their sums, split as in CONFIG (fixed {c.forward_fixed_ms:g} : {c.interval_fixed_ms:g}, "
            f"per sequence {c.forward_per_seq_ms:g} : {sum(getattr(c, f) for f in per_seq):g})"
        )
    server, server_note = api_server(settings, observations)
    fixed |= server
    gap, gap_note = client_gap(settings, observations, past_api_server=bool(server))
    fixed["client_gap_ms"] = gap
    if server_note:
        notes.append(server_note)
    if has_ttft:
        terms.append(Term(("forward_per_prefill_token_ms",)))
        if len(prompts) >= 2:
            notes.append(gap_note + f"; the prefill cost from TTFT against prompt length ({prompts[0]}-{prompts[-1]})")
        else:
            notes.append(
                f"one prompt length ({prompts[0]} tokens): the prefill cost and the load generator's turnaround "
                f"both shift TTFT by a constant; {gap_note}, and the prefill cost takes up the rest (add a run "
                "with another prompt length to pin the prefill cost down)"
            )
    else:
        notes.append(f"no TTFT the engine accounts for: forward_per_prefill_token_ms kept as in CONFIG; {gap_note}")
    if ttft_note:
        notes.append(ttft_note)
    return TermChoice(terms, notes, fixed)


def _timed(observations: list[Observation]) -> tuple[list[Observation], str]:
    """The steps whose TTFT shows the engine's part, and a note on what was taken off or left out."""
    read = gauges_read(observations)
    timed, left_out, outside = [], [], []
    for o in observations:
        measured = o.ttft_fitted_ms
        if measured is None:
            continue
        if engine_ttft_ms(o, measured, read) is None:
            left_out.append(o.label)
        else:
            timed.append(o)
            if o.outside_engine_ms:
                outside.append(f"{o.outside_engine_ms:.1f} ms at {o.users} users")
    parts = []
    if outside:
        parts.append(
            "TTFT fitted is the engine's part: the client's less each request's time in flight outside the "
            f"engine, by Little's law ({', '.join(outside)})"
        )
    if left_out:
        parts.append(
            f"TTFT left out of the fit for {', '.join(left_out)}: the time outside the engine (an API server's "
            f"queue) took up over {1 - ENGINE_TTFT_MIN_SHARE:.0%} of it, or the engine's gauges were not read there"
        )
    return timed, "; ".join(parts)


def api_server(settings: SimSettings, observations: list[Observation]) -> tuple[dict[str, float], str]:
    """The engine's API server (frontend.py) where the runs show requests in flight at the load
    generator but not in the engine (its running + waiting gauges), OUTSIDE_MIN of the users or
    more at some step; else none ({}).

    A first-come-first-served server that takes s per request serves at most 1 / s requests per
    second, so every step bounds s by 1 / its requests per second; s is the largest the steps
    allow: the server saturated at the busiest step. A server that fast still makes every step's
    throughput, and caps the loads beyond them. (Its time per token overlaps the request's time in
    the engine, so the requests held outside show a server only where it falls behind: below that
    they do not bound s. On 2 cores vLLM's API server made 683 and 688 tok/s at 8 and 32 users in
    one run after 2,936 at 16 in the one before; a model without it predicted 17.9x.) One output
    length cannot split s between the request and its tokens: split as in CONFIG, else all per
    token (vLLM's server turns each token into an SSE event)."""
    seen = []
    busiest: Observation | None = None
    for o in observations:
        inside = o.in_engine_mean
        if inside is None or o.client_inflight_mean is None or not o.rps:
            continue
        held = o.client_inflight_mean - inside
        if held >= OUTSIDE_MIN * o.users:
            seen.append(f"{held:.1f} of {o.users} at {o.label}")
        if busiest is None or o.rps > (busiest.rps or 0.0):
            busiest = o
    if not seen or busiest is None or not busiest.rps:
        return {}, ""
    s_ms = 1000.0 / busiest.rps / settings.time_scale
    c = settings.cost
    tokens = busiest.output_tokens
    config_ms = c.frontend_per_request_ms + c.frontend_per_token_ms * tokens
    request_share = c.frontend_per_request_ms / config_ms if config_ms > 0 else 0.0
    values = {
        "frontend_per_request_ms": s_ms * request_share,
        "frontend_per_token_ms": s_ms * (1.0 - request_share) / tokens,
    }
    split = "as in CONFIG" if config_ms > 0 else "all per token"
    return values, (
        f"API server: the engine held fewer requests than the load generator had in flight ({', '.join(seen)}); "
        f"modelled as one first-come-first-served server taking {s_ms:.4g} ms per request of {tokens} tokens "
        f"(frontend_per_request_ms {values['frontend_per_request_ms']:.4g}, frontend_per_token_ms "
        f"{values['frontend_per_token_ms']:.4g}: {split}): saturated at {busiest.label}'s {busiest.rps:.4g} "
        "requests per second, the most any step made (a faster server cannot be told from these runs)"
    )


def client_gap(
    settings: SimSettings, observations: list[Observation], past_api_server: bool = False
) -> tuple[float, str]:
    """The time a user's request spends outside the engine between two of its requests, by
    Little's law from the engine's own running + waiting counts where they show a share of
    the users outside it (the load generator, HTTP, an API server that holds requests);
    else a load generator's usual turnaround, assumed. A user's cycle (one request and the
    time to its next) is users / requests per second, from the step's throughput; the share
    outside the engine is that share of the cycle. (The client's E2E is not the time in the
    engine: it holds the API server's share too. Taken as such, a gauge near 0 on a starved
    machine made the gap 13 s against a 0.36-s cycle, and the model finished nothing.) Where the
    gauges read 0 at every scrape (the tiny model's sub-ms steps on a starved machine), the whole
    cycle is outside the engine: left out, the gap was assumed 1 ms and the model predicted 5-35x
    the TPS measured at the steps it was fitted to. past_api_server: an API server is modelled
    (api_server), which holds the requests in flight outside the engine; the gap is then the
    share of the users the load generator did not have in flight."""
    estimates = []
    for o in observations:
        if o.output_tps <= 0 or o.output_tokens <= 0:
            continue
        if past_api_server and o.client_inflight_mean is not None:
            # the load generator's own count (from its requests, not sampled): no noise floor
            outside = max(o.users - o.client_inflight_mean, 0.0) / o.users
        elif o.in_engine_mean is not None:
            outside = (o.users - o.in_engine_mean) / o.users
            if outside < OUTSIDE_MIN:
                continue  # a gauge that read 0 puts the whole cycle outside: bounded by it
        else:
            continue
        cycle_ms = 1000.0 * o.users * o.output_tokens / o.output_tps
        estimates.append(cycle_ms * outside)
    if estimates:
        estimates.sort()
        gap_ms = estimates[len(estimates) // 2]
        if past_api_server:
            held = (
                "the load generator had fewer requests in flight than there were users "
                f"(the median of {len(estimates)} step(s))"
            )
        else:
            held = (
                f"the engine held fewer requests than there were users (the median of {len(estimates)} step(s) with "
                f"over {OUTSIDE_MIN:.0%} of them outside it: the load generator, HTTP, or an API server holding them)"
            )
        return gap_ms / settings.time_scale, (
            f"client_gap_ms {gap_ms / settings.time_scale:.4g}: {held}; modelled as time between a user's requests "
            "(it is not in the modelled TTFT)"
        )
    gap = ASSUMED_CLIENT_GAP_MS / settings.time_scale
    return gap, (
        f"client_gap_ms assumed {gap:g} (the load generator's turnaround; a step's figures do not pin it down: "
        "it only moves where in an engine step the next request lands)"
    )


def _per_seq_interval(settings: SimSettings, notes: list[str]) -> tuple[str, ...]:
    """The per-sequence interval fields the data sees as one term."""
    fields: tuple[str, ...] = ("interval_per_seq_ms",)
    c = settings.cost
    if settings.slot_reuse:
        notes.append(
            "slot reuse reschedules only the sequences that changed (about 2 per request): "
            f"interval_schedule_per_seq_ms is too small a part of a step to pin down; kept at "
            f"{c.interval_schedule_per_seq_ms:g}"
        )
    else:
        fields += ("interval_schedule_per_seq_ms",)
        notes.append(
            "without slot reuse every sequence is rescheduled each step: interval_per_seq_ms and "
            "interval_schedule_per_seq_ms both grow with the batch; fitted as one, split as in CONFIG "
            f"({c.interval_per_seq_ms:g} : {c.interval_schedule_per_seq_ms:g})"
        )
    if not settings.detokenizer_async:
        fields += ("interval_detokenize_per_seq_ms",)
    return fields


def base_values(settings: SimSettings) -> dict[str, float]:
    """Each field's starting value: CONFIG's, or the default where CONFIG has 0 (a factor cannot move 0).
    The API server's costs stay as they are: 0 is no API server, and fit_terms sets them, never a factor."""
    defaults = SimSection()
    out: dict[str, float] = {}
    for name in SimSection.model_fields:
        if not name.endswith("_ms"):
            continue
        value = float(getattr(settings.cost, name))
        if value <= 0 and not name.startswith("frontend_"):
            value = float(getattr(defaults, name)) or ASSUMED_CLIENT_GAP_MS / settings.time_scale
        out[name] = value
    return out
