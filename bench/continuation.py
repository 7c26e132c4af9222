"""Issue 37, the whole chain measured: a backend SIGKILLed under load, with `[gateway]
continue_streams` off and on, side by side in one run.

Processes, for each mode afresh: two fixture upstreams serving model "m"
(`python -m tests.fixtures.upstream`, a stream of words t0 t1 ... that it continues from the
text it is given, as vLLM does with continue_final_message, so every word can be checked), a
`zerogap gateway` with both as backends (health checked every 0.2 s, a dead one out of the pool at
its first refused connection), and this process's `--concurrency` clients. Each client loops
over chat streams (max_tokens 48, ignore_eos, include_usage) for `--duration-s` (and at most
`--max-requests` requests in all); at `--kill-at` of the duration one upstream is SIGKILLed.

Each request ends as one of:
  whole    200, the words t0..t47 each once and in order, no error event, one [DONE] at the end,
           one role chunk, one id, one finish_reason, usage.completion_tokens 48 (charged once)
  cut      200, and anything else: an error event, missing or repeated words, a lost connection,
           a seam the client can see (a second id or role chunk, two finish_reasons, usage off)
  refused  an HTTP error answer (no stream)
  failed   no answer: the connection failed, or the client's timeout
and the gateway's zerogap_continuations_total (by outcome) is read from its /metrics at the end.

Verdict: FAIL (exit 1) when continue_streams=true leaves any stream cut, when a mode's kill
broke no stream (off: no stream cut; on: no continuation counted), for then the bench measured
nothing, or when the gateway refused or failed a request (the other backend was there to serve it).
For a mode that left streams cut with continuation on, or refused or failed any, the gateway's
warnings and its first traceback are shown and its log is kept (its path printed).

    .venv/bin/python -m bench.continuation [--duration-s 20] [--concurrency 128] [--modes off,on]
        [--rounds 1] [--max-requests 4000] [--kill-at 0.5] [--interval-s 0.05] [--connect-timeout-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from common.commands import zerogap_command
from common.net import free_port, wait_for_port
from common.process_group import stop_process
from common.promtext import sum_samples

KEY = "bench-continuation-key"
MODEL = "m"
PROMPT = "one two three four"
CONTINUATIONS = "zerogap_continuations_total"
CONT_OUTCOMES = ("continued", "failed", "not_continued")
MODE_NAMES = {"off": False, "on": True}
# The gateway: a dead backend leaves the pool at its first refused connection (flights.take_out) or
# after 3 failed checks 0.2 s apart; a frozen stream is given up 0.5 s after its backend left.
# connect_timeout_s stays the gateway's default (5 s, --connect-timeout-s): a SIGKILLed backend's port
# refuses at once, and at 1 s, on this busy 2-core machine, connections of continuations to the
# surviving upstream timed out in the burst after the kill (a stalled loop or a dropped SYN, sent
# again after 1 s), which left them no backend they had not tried (bench/PERF_NOTES.md, issue 37).
GATEWAY_SETTINGS = {
    "health_interval_s": 0.2,
    "eject_grace_s": 0.5,
    "unhealthy_threshold": 3,
}
MAX_WARNINGS_SHOWN = 20


@dataclass
class Options:
    duration_s: float = 20.0
    concurrency: int = 128
    max_requests: int = 4000  # per mode and round
    modes: tuple[bool, ...] = (False, True)
    rounds: int = 1
    kill_at: float = 0.5  # share of duration_s
    interval_s: float = 0.05  # the upstreams' gap between tokens (and their TTFT)
    num_tokens: int = 48
    timeout_s: float = 60.0  # one request, from its start to its last byte
    connect_timeout_s: float = 5.0  # the gateway's [gateway].connect_timeout_s (its default)


# -- one stream, judged (pure) ------------------------------------------------------------------


def judge_stream(raw: bytes, num_tokens: int, lost: bool = False) -> str:
    """The outcome "whole", or why the stream (status 200) is cut: the first of error_event, lost (the
    connection dropped mid-body), missing (a prefix of the words), wrong_words (repeated or out of
    order), no_done / done_twice, seam (a second role chunk or id, finish_reason count),
    usage (completion_tokens is not num_tokens)."""
    words: list[str] = []
    ids: set[str] = set()
    num_done = num_roles = num_finish = 0
    error = False
    usage: dict[str, Any] | None = None
    tail_after_done = False
    for part in raw.split(b"\n\n"):
        line = part.strip()
        if not line or line.startswith(b":"):
            continue
        if num_done and line:
            tail_after_done = True
        if line == b"data: [DONE]":
            num_done += 1
            continue
        if not line.startswith(b"data: "):
            continue
        try:
            obj = json.loads(line[6:])
        except ValueError:
            return "wrong_words"
        if not isinstance(obj, dict):
            return "wrong_words"
        if "error" in obj:
            error = True
            continue
        if isinstance(obj.get("id"), str):
            ids.add(obj["id"])
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if "role" in delta:
                num_roles += 1
            words += str(delta.get("content") or "").split()
            num_finish += choice.get("finish_reason") is not None
    want = [f"t{i}" for i in range(num_tokens)]
    if error:
        return "error_event"
    if lost:
        return "lost"
    if words != want:
        return "missing" if want[: len(words)] == words else "wrong_words"
    if num_done != 1 or tail_after_done:
        return "no_done" if num_done == 0 else "done_twice"
    if len(ids) != 1 or num_roles != 1 or num_finish != 1:
        return "seam"
    if usage is None or usage.get("completion_tokens") != num_tokens:
        return "usage"
    return "whole"


# -- one mode's run --------------------------------------------------------------------------------


@dataclass
class ModeResult:
    continued: bool  # continue_streams
    num_requests: int = 0
    num_whole: int = 0
    num_cut: int = 0
    num_refused: int = 0
    num_failed: int = 0
    cut_reasons: Counter[str] = field(default_factory=Counter)
    num_at_kill: int = 0  # requests in flight (started, not ended) at the kill
    continuations: dict[str, float] = field(default_factory=dict)  # outcome -> zerogap_continuations_total
    retries: float = 0.0  # zerogap_retries_total: attempts after a request's first
    span_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average at the start and at the end
    examples: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the gateway's log lines that say why (see log_excerpt)
    kept_log: str = ""  # where the gateway's log was kept, if it was

    @property
    def mode(self) -> str:
        return "on" if self.continued else "off"

    def count(self, outcome: str, example: str = "") -> None:
        self.num_requests += 1
        if outcome == "whole":
            self.num_whole += 1
        elif outcome == "refused":
            self.num_refused += 1
        elif outcome == "failed":
            self.num_failed += 1
        else:
            self.num_cut += 1
            self.cut_reasons[outcome] += 1
        if outcome != "whole" and example and len(self.examples) < 3:
            self.examples.append(f"{outcome}: {example}")


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, opts: Options) -> tuple[str, str]:
    """(outcome, an example of what was seen when it is not whole)."""
    raw = b""
    try:
        async with asyncio.timeout(opts.timeout_s):
            async with session.post(url, data=body) as resp:
                if resp.status != 200:
                    return "refused", f"{resp.status} {(await resp.read())[:200]!r}"
                try:
                    async for data in resp.content.iter_any():
                        raw += data
                except (aiohttp.ClientError, OSError) as exc:
                    return judge_stream(raw, opts.num_tokens, lost=True), f"{type(exc).__name__}: {raw[-200:]!r}"
    except TimeoutError:
        return ("failed" if not raw else "lost"), f"client timeout after {opts.timeout_s:g} s: {raw[-200:]!r}"
    except (aiohttp.ClientError, OSError) as exc:
        return "failed", f"{type(exc).__name__}: {exc}"
    outcome = judge_stream(raw, opts.num_tokens)
    return outcome, ("" if outcome == "whole" else repr(raw[-300:]))


async def drive(opts: Options, url: str, kill: Any, result: ModeResult) -> None:
    """`concurrency` clients, each looping over streams until the duration or the request budget
    is spent; `kill()` at kill_at of the duration."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "max_tokens": opts.num_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    t0 = time.monotonic()
    end_s = t0 + opts.duration_s
    kill_s = t0 + opts.kill_at * opts.duration_s
    started = 0
    in_flight: set[int] = set()
    stream_s = opts.interval_s * (opts.num_tokens + 1)

    async def client(i: int) -> None:
        nonlocal started
        await asyncio.sleep(i * stream_s / opts.concurrency)  # spread over one stream's length
        while time.monotonic() < end_s and started < opts.max_requests:
            started += 1
            me = started
            in_flight.add(me)
            outcome, example = await one_request(session, url + "/v1/chat/completions", body, opts)
            in_flight.discard(me)
            result.count(outcome, example)
            if outcome == "failed":
                await asyncio.sleep(0.05)  # no tight loop against a gateway that is not there

    async def killer() -> None:
        await asyncio.sleep(max(0.0, kill_s - time.monotonic()))
        result.num_at_kill = len(in_flight)
        kill()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        killing = asyncio.create_task(killer())
        await asyncio.gather(*(client(i) for i in range(opts.concurrency)))
        await killing
        async with session.get(url + "/metrics") as resp:
            page = await resp.text()
    result.span_s = time.monotonic() - t0
    for outcome in CONT_OUTCOMES:
        result.continuations[outcome] = sum_samples(page, CONTINUATIONS, {"outcome": outcome}) or 0.0
    result.retries = sum_samples(page, "zerogap_retries_total") or 0.0


def write_config(
    folder: Path, port: int, upstream_ports: list[int], continued: bool, connect_timeout_s: float = 5.0
) -> Path:
    path = folder / "config.toml"
    settings = {**GATEWAY_SETTINGS, "connect_timeout_s": connect_timeout_s, "continue_streams": continued}
    lines = [
        f'[server]\nport = {port}\napi_key = "{KEY}"',
        '[gateway]\nkey_store = "keys.db"',
        *(f"{k} = {json.dumps(v)}" for k, v in settings.items()),
        '[logging]\nlevel = "info"',
    ]
    for i, up in enumerate(upstream_ports):
        lines.append(f'[[backends]]\nname = "up{i}"\nurl = "http://127.0.0.1:{up}"\nmodel = "{MODEL}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the process listens on its port; if it exits first, say why (its log's end)."""
    try:
        wait_for_port(port, 60, proc)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; its log ends:\n{log.read_text(errors='replace')[-2000:]}") from exc


def run_mode(opts: Options, continued: bool) -> ModeResult:
    """Start the two upstreams and the gateway, drive the load, kill upstream up0 midway, stop
    everything."""
    repo = Path(__file__).resolve().parent.parent
    result = ModeResult(continued)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="zerogap-continuation-") as tmp:
        folder = Path(tmp)
        up_ports, port = [free_port(), free_port()], free_port()
        timing = ["--ttft-s", str(opts.interval_s), "--interval-s", str(opts.interval_s)]
        tokens = ["--num-output-tokens", str(opts.num_tokens)]
        procs = []
        for p in up_ports:
            with (folder / f"upstream-{p}.log").open("wb") as out:  # aiohttp's tracebacks of cut requests
                cmd = [sys.executable, "-m", "tests.fixtures.upstream", "--port", str(p), "--model", MODEL, *timing,
                       *tokens]  # fmt: skip
                procs.append(subprocess.Popen(cmd, cwd=repo, stdout=out, stderr=out))
        doomed = procs[0]
        log = folder / "gateway.log"
        try:
            for p, proc in zip(up_ports, procs, strict=True):
                ready(p, proc, folder / f"upstream-{p}.log")
            config = write_config(folder, port, up_ports, continued, opts.connect_timeout_s)
            with log.open("wb") as err:
                gateway = subprocess.Popen(
                    zerogap_command("gateway", "--config", str(config)), stdout=err, stderr=err, cwd=repo
                )
            procs.append(gateway)
            ready(port, gateway, log)
            time.sleep(1.0)  # both backends pass their first health checks

            def kill() -> None:
                os.kill(doomed.pid, signal.SIGKILL)

            asyncio.run(drive(opts, f"http://127.0.0.1:{port}", kill, result))
        finally:
            for proc in procs:
                stop_process(proc, 10)
        if (continued and result.num_cut) or result.num_refused or result.num_failed:
            text = log.read_text(errors="replace")
            result.warnings = log_excerpt(text)
            kept = Path(tempfile.mkstemp(prefix=f"zerogap-continuation-{result.mode}-", suffix=".log")[1])
            kept.write_text(text)
            result.kept_log = str(kept)
    result.load = (load_before, os.getloadavg()[0])
    return result


def log_excerpt(text: str) -> list[str]:
    """The gateway's warning and error lines (the last MAX_WARNINGS_SHOWN), then its first
    traceback."""
    lines = text.splitlines()
    shown = [line for line in lines if "WARNING" in line or "ERROR" in line][-MAX_WARNINGS_SHOWN:]
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if start is not None:
        end = start + 1
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
            end += 1
        shown += lines[start : end + 1]  # the exception's own line ends it
    return shown


# -- the report and the verdict (pure) -------------------------------------------------------------

HEADER = (
    "mode  requests  whole   cut refused failed at_kill continued cont_failed not_cont retries   load   cut by reason"
)


def row(r: ModeResult) -> str:
    c = r.continuations
    reasons = ", ".join(f"{k} {v}" for k, v in r.cut_reasons.most_common()) or "-"
    return (
        f"{r.mode:<4} {r.num_requests:9d} {r.num_whole:6d} {r.num_cut:5d} {r.num_refused:7d} {r.num_failed:6d}"
        f" {r.num_at_kill:7d} {c.get('continued', 0):9.0f} {c.get('failed', 0):11.0f} {c.get('not_continued', 0):8.0f}"
        f" {r.retries:7.0f} {r.load[0]:4.1f}-{r.load[1]:<4.1f} {reasons}"
    )


def summary(results: list[ModeResult]) -> list[str]:
    """Per mode over the rounds: the median and range of requests, cut and continued."""
    lines = []
    for continued in (False, True):
        rs = [r for r in results if r.continued == continued]
        if len(rs) < 2:
            continue

        def med(values: list[float]) -> str:
            return f"{statistics.median(values):g} [{min(values):g}..{max(values):g}]"

        lines.append(
            f"{rs[0].mode}: {len(rs)} rounds; requests {med([r.num_requests for r in rs])}, "
            f"cut {med([r.num_cut for r in rs])}, refused+failed {med([r.num_refused + r.num_failed for r in rs])}, "
            f"at the kill {med([r.num_at_kill for r in rs])}, "
            f"continued {med([r.continuations.get('continued', 0) for r in rs])}"
        )
    return lines


def verdict(results: list[ModeResult]) -> tuple[bool, str]:
    """PASS when continuation on left no stream cut and every mode's kill broke streams."""
    problems = []
    on = [r for r in results if r.continued]
    off = [r for r in results if not r.continued]
    cut_on = sum(r.num_cut for r in on)
    if cut_on:
        problems.append(f"continue_streams=true left {cut_on} streams cut")
    if any(r.num_cut == 0 for r in off):
        problems.append("continue_streams=false cut no stream in a round: the kill hit no stream, nothing measured")
    if any(sum(r.continuations.values()) == 0 for r in on):
        problems.append("continue_streams=true counted no continuation in a round: the kill hit no stream")
    refused = sum(r.num_refused + r.num_failed for r in results)
    if refused:
        problems.append(f"the gateway refused or failed {refused} requests")
    if not results:
        problems.append("no mode ran")
    parts = []
    if off:
        parts.append(f"off: {sum(r.num_cut for r in off)} of {sum(r.num_requests for r in off)} streams cut")
    if on:
        cont = sum(r.continuations.get("continued", 0) for r in on)
        parts.append(f"on: {cut_on} of {sum(r.num_requests for r in on)} cut, {cont:.0f} continued")
    parts.append(f"{refused} refused or failed")
    head = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    return not problems, f"verdict: {head} ({'; '.join(parts)})"


def run(opts: Options) -> int:
    cores = os.cpu_count()
    print(
        f"bench.continuation: {opts.concurrency} streams of {opts.num_tokens} tokens ({opts.interval_s:g} s apart),"
        f" {opts.duration_s:g} s a mode (at most {opts.max_requests} requests), one of two upstreams SIGKILLed at"
        f" {opts.kill_at:.0%}; connect_timeout_s {opts.connect_timeout_s:g}; {cores} cores,"
        f" load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: list[ModeResult] = []
    print(HEADER, flush=True)
    for i in range(opts.rounds):
        modes = opts.modes if i % 2 == 0 else tuple(reversed(opts.modes))  # neither always goes first
        for continued in modes:
            r = run_mode(opts, continued)
            results.append(r)
            print(row(r), flush=True)
            for example in r.examples:
                print(f"      e.g. {example[:400]}", flush=True)
            for line in r.warnings:
                print(f"      gateway: {line[:300]}", flush=True)
            if r.kept_log:
                print(f"      the gateway's log: {r.kept_log}", flush=True)
    for line in summary(results):
        print(line)
    ok, line = verdict(results)
    print(line)
    return 0 if ok else 1


def parse_modes(text: str) -> tuple[bool, ...]:
    try:
        return tuple(MODE_NAMES[m.strip()] for m in text.split(",") if m.strip())
    except KeyError as exc:
        raise argparse.ArgumentTypeError(f"modes are off and on, comma-separated: {text!r}") from exc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A backend SIGKILLed under load, continue_streams off and on.")
    p.add_argument("--duration-s", type=float, default=20.0, help="each mode's load (per round)")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--modes", type=parse_modes, default=(False, True), help="off,on (the default), off, or on")
    p.add_argument("--rounds", type=int, default=1, help="each mode this many times (the order alternating)")
    p.add_argument("--max-requests", type=int, default=4000, help="per mode and round")
    p.add_argument("--kill-at", type=float, default=0.5, help="share of the duration at which up0 is SIGKILLed")
    p.add_argument("--interval-s", type=float, default=0.05, help="the upstreams' TTFT and gap between tokens")
    p.add_argument("--num-tokens", type=int, default=48, help="max_tokens of every request (ignore_eos)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="one request's limit")
    p.add_argument("--connect-timeout-s", type=float, default=5.0, help="the gateway's [gateway].connect_timeout_s")
    a = p.parse_args(argv)
    opts = Options(a.duration_s, a.concurrency, a.max_requests, a.modes, a.rounds, a.kill_at, a.interval_s,
                   a.num_tokens, a.timeout_s, a.connect_timeout_s)  # fmt: skip
    return run(opts)


if __name__ == "__main__":
    raise SystemExit(main())
