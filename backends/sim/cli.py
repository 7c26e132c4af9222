"""`zerogap sim ...` (serve one simulated engine), `zerogap sim plan ...` (virtual time;
with --users N --slo ..., the fewest replicas for N users) and `zerogap sim calibrate ...`
(fit [sim] to load-test runs: calibrate_cli.py).

Settings precedence: flags > config.toml [scheduler]/[token_interval]/[sim] > defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from backends.sim.plan.capacity import MAX_REPLICAS
from backends.sim.plan.sweep_compare import compare_lines
from backends.sim.settings import SimSettings, settings_from_config
from common.argtypes import both_slo_targets, concurrency_list, positive_float, positive_int
from common.config import ConfigError, load_config

DEFAULT_PORT = 8100


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config.toml to read (default: ./config.toml if present, else defaults)")
    parser.add_argument("--model", help="the model name clients ask for (default: [engine].served_model_name)")
    parser.add_argument("--scheduling", choices=["sync", "async"], help="async hides the token interval")
    parser.add_argument("--slot-reuse", action=argparse.BooleanOptionalAction, default=None,
                        help="persistent batch: reschedule only the requests that changed")  # fmt: skip
    parser.add_argument("--detokenizer-async", action=argparse.BooleanOptionalAction, default=None,
                        help="detokenize outside the engine process (about 10%% less interval)")  # fmt: skip
    parser.add_argument("--time-scale", type=positive_float, help="multiply every modelled time (10 = 10x slower)")
    parser.add_argument("--max-num-seqs", type=positive_int)
    parser.add_argument("--max-num-batched-tokens", type=positive_int)
    parser.add_argument("--max-model-len", type=positive_int)
    parser.add_argument("--kv-cache-blocks", type=positive_int)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)


def resolve_settings(args: argparse.Namespace) -> SimSettings:
    """Raises ConfigError with a message for the user."""
    path = args.config or ("config.toml" if Path("config.toml").is_file() else None)
    base = settings_from_config(load_config(path, strict_env=False) if path else None)
    async_scheduling = None if args.scheduling is None else args.scheduling == "async"
    settings = base.with_flags(
        model=args.model,
        async_scheduling=async_scheduling,
        slot_reuse=args.slot_reuse,
        detokenizer_async=args.detokenizer_async,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        time_scale=args.time_scale,
        kv_cache_blocks=args.kv_cache_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    capacity = settings.cost.kv_cache_blocks * settings.cost.block_size
    if settings.max_model_len > capacity:
        raise ConfigError(
            f"max_model_len {settings.max_model_len} exceeds the KV cache ({capacity} tokens = "
            f"kv_cache_blocks x block_size). Lower max_model_len or raise [sim].kv_cache_blocks."
        )
    return settings


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap sim",
        description="Serve one simulated vLLM engine (OpenAI API + vLLM metrics). "
        "`zerogap sim plan --help` runs a load plan in virtual time.",
    )
    _engine_flags(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    return parser


def plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap sim plan",
        description="Run a stepped load plan in virtual time (no sleeping) and print, per concurrency step, "
        "output TPS, TTFT, TPOT and GPU busy (times in modelled ms). With --users N --slo ttft_ms=..,tpot_ms=..: "
        "the fewest replicas that serve N users within the SLOs, and the table it decided from.",
    )
    _engine_flags(parser)
    parser.add_argument("--concurrency", type=concurrency_list, help="steps, e.g. 32,128,256")
    parser.add_argument("--users", type=positive_int, help="the capacity question: how many replicas for N users")
    parser.add_argument("--slo", type=both_slo_targets, help="with --users: ttft_ms=N,tpot_ms=N (p50s, in ms)")
    parser.add_argument("--max-replicas", type=positive_int, default=MAX_REPLICAS,
                        help=f"with --users: try up to this many replicas (default {MAX_REPLICAS})")  # fmt: skip
    parser.add_argument("--prompt-tokens", type=positive_int, default=512)
    parser.add_argument("--output-tokens", type=positive_int, default=256)
    parser.add_argument("--step-duration-s", type=positive_float, default=180.0, help="hold each step (default 180)")
    parser.add_argument("--measure-last-s", type=positive_float, default=120.0, help="measure the last N s (120)")
    parser.add_argument("--compare", action="store_true",
                        help="run baseline, slot reuse and async+slot reuse side by side")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: list[str]) -> int:
    if argv and argv[0] == "plan":
        return _plan_main(argv[1:])
    if argv and argv[0] == "calibrate":
        from backends.sim.calibrate.cli import main as calibrate_main

        return calibrate_main(argv[1:])
    args = serve_parser().parse_args(argv)
    try:
        settings = resolve_settings(args)
    except ConfigError as exc:
        print(f"zerogap sim: {exc}", file=sys.stderr)
        return 2
    return _serve(settings, args.host, args.port)


def _plan_main(argv: list[str]) -> int:
    from backends.sim.plan.sweep import format_table, run_sweep

    parser = plan_parser()
    args = parser.parse_args(argv)
    if args.measure_last_s > args.step_duration_s:
        parser.error("--measure-last-s must not exceed --step-duration-s")
    if (args.users is None) == (args.concurrency is None):
        parser.error("give --concurrency (a load plan) or --users N --slo ... (the capacity answer)")
    if args.users is not None and args.slo is None:
        parser.error("--users needs --slo ttft_ms=N,tpot_ms=N")
    try:
        settings = resolve_settings(args)
    except ConfigError as exc:
        print(f"zerogap sim plan: {exc}", file=sys.stderr)
        return 2
    if args.prompt_tokens + args.output_tokens > settings.max_model_len:
        parser.error(
            f"--prompt-tokens + --output-tokens = {args.prompt_tokens + args.output_tokens} exceeds "
            f"max_model_len {settings.max_model_len}; lower them or pass --max-model-len"
        )
    if args.users is not None:
        return _capacity(settings, args)
    variants = [settings]
    if args.compare:
        variants = [settings.with_flags(async_scheduling=a, slot_reuse=s) for a, s in _COMPARE]
    rows = []
    for variant in variants:
        rows += run_sweep(
            variant, args.concurrency, args.prompt_tokens, args.output_tokens, args.step_duration_s,
            args.measure_last_s,
        )  # fmt: skip
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
    else:
        print(
            f"virtual time, time_scale {settings.time_scale:g}; prompt {args.prompt_tokens} tokens, "
            f"output {args.output_tokens}; each step held {args.step_duration_s:g} s, "
            f"measured over the last {args.measure_last_s:g} s; times in ms"
        )
        print(format_table(rows))
        if args.compare:
            print("\n".join(compare_lines(rows)))
    return 0


def _capacity(settings: SimSettings, args: argparse.Namespace) -> int:
    from backends.sim.plan.capacity import fewest_replicas, format_answer
    from backends.sim.plan.pool_predict import Load, Window

    load = Load(args.users, args.prompt_tokens, args.output_tokens)
    window = Window(args.step_duration_s - args.measure_last_s, args.measure_last_s)
    answer = fewest_replicas(settings, load, args.slo, window, args.max_replicas)
    print(
        f"virtual time, mode {settings.mode}, time_scale {settings.time_scale:g}; each replica count held "
        f"{args.step_duration_s:g} s, measured over the last {args.measure_last_s:g} s; times in ms"
    )
    print(format_answer(answer, load, args.slo))
    return 0 if answer.replicas is not None else 1


_COMPARE = ((False, False), (False, True), (True, True))


def _serve(settings: SimSettings, host: str, port: int) -> int:
    loop = _new_loop()
    try:
        return loop.run_until_complete(_serve_async(settings, host, port))
    finally:
        loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _serve_async(settings: SimSettings, host: str, port: int) -> int:
    from aiohttp import web

    from backends.sim.server.app import create_app

    runner = web.AppRunner(create_app(settings), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        print(f"zerogap sim: cannot listen on {host}:{port} ({exc.strerror}). Pass another --port.", file=sys.stderr)
        return 1
    print(
        f"zerogap sim: serving {settings.model!r} on http://{host}:{port} "
        f"(mode {settings.mode}, time_scale {settings.time_scale:g})",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0
