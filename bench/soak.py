"""Soak: many streams through the gateway for a long time, with the faults clients cause and
upstreams make, watching the gateway for leaks.

Processes: two fixture upstreams (tests/fixtures/upstream.py, known timing), the gateway
(`zerogap gateway`), and this load generator. Each of `--concurrency` clients loops over a mix:
good streams (TTFT measured), good non-streamed requests, client cancels (hang up after the first
chunk), upstream errors (the upstream answers 500, or resets the connection after 2 tokens),
and bad requests (not JSON, no model, unknown model, bad key, wrong Content-Type).

Every `--report-s` it prints the gateway's RSS, open fds and asyncio tasks (medians of 1 s
samples), the backends it took out of the pool (zerogap_backend_ejections_total, all causes),
and the good streams' TTFT p50/p99; under the line, the gateway's log lines of backends leaving
and rejoining the pool in that interval (the gateway logs at level info, no access log).
At the end it checks the targets:
  - RSS and open fds flat after the warm-up: growth < 5 % over the reports after `--warmup-s`
    (the mean of their last quarter over the mean of their first quarter, printed as a ratio);
  - zero failed good requests; zero 5xx answers to bad requests; no client ever hangs;
  - zero outlier ejections: every backend is equally noisy (the mix's 500s and resets), so the
    outlier rules, which judge a backend against its peers, must eject none (a health ejection
    of a backend that really stopped answering is not counted here).
Exit code 0 when all hold, 1 otherwise.

    .venv/bin/python -m bench.soak [--concurrency 512] [--duration-s 1800] [--report-s 60] [--warmup-s 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.soak_load import KEY, Tally, run_clients
from common.commands import zerogap_command
from common.net import free_port, wait_for_port
from common.process_group import stop_process
from common.promtext import sum_samples

GROWTH_LIMIT = 0.05
EJECTIONS = "zerogap_backend_ejections_total"
POOL_EVENTS = ("leaves the pool", "is healthy again", "comes back")  # the gateway's log lines of them
MAX_EVENTS_SHOWN = 8  # per report


@dataclass
class SoakOptions:
    concurrency: int = 512
    duration_s: float = 1800.0
    report_s: float = 60.0
    warmup_s: float = 600.0
    interval_s: float = 0.1  # the upstreams' gap between tokens (TTFT the same)
    seed: int = 1


@dataclass
class Report:
    """One --report-s interval."""

    end_s: float
    tally: Tally
    rss_mb: float
    num_fds: float
    num_tasks: float
    num_ejections: float  # backends taken out of the pool in the interval
    num_streams: float  # requests the gateway had in flight at its backends (the same scrape as num_tasks)

    @property
    def tasks_per_stream(self) -> float:
        """Tasks alive per stream in flight: flat under any load (the number of streams in flight follows how
        fast the clients turn around, which a busy machine changes), growing with a leak."""
        return self.num_tasks / max(self.num_streams, 1.0)

    def line(self) -> str:
        t = self.tally
        p50, p99 = t.ttft_ms(0.5), t.ttft_ms(0.99)
        return (
            f"{self.end_s:7.0f} {t.num_requests:8d} {t.num_requests / max(t.span_s, 1e-9):7.1f} {t.num_good_failed:5d}"
            f" {t.num_bad_5xx:5d} {t.num_hung:5d} {self.rss_mb:8.1f} {self.num_fds:6.0f} {self.num_tasks:6.0f}"
            f" {self.num_streams:7.0f} {self.num_ejections:7.0f} {p50:8.1f} {p99:8.1f}"
        )


HEADER = (
    "  end_s requests     rps  good_failed bad_5xx hung  rss_mb    fds  tasks streams ejected ttft_p50 ttft_p99 (ms)"
)


@dataclass
class SoakResult:
    reports: list[Report] = field(default_factory=list)
    rss_growth: float = 0.0
    fds_growth: float = 0.0
    tasks_growth: float = 0.0
    num_outlier_ejections: float = 0.0  # in the whole run
    failures: list[str] = field(default_factory=list)  # the targets missed (empty: all held)


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def proc_num_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def scrape_gateway(session: aiohttp.ClientSession, url: str) -> tuple[float, float, float, float]:
    """The gateway's asyncio tasks, its backend ejections so far (all backends and causes), its
    outlier ejections so far and its requests in flight at the backends."""
    async with session.get(url + "/metrics") as resp:
        page = await resp.text()
    return (
        sum_samples(page, "zerogap_event_loop_tasks") or 0.0,
        sum_samples(page, EJECTIONS) or 0.0,
        sum_samples(page, EJECTIONS, {"cause": "outlier"}) or 0.0,
        sum_samples(page, "zerogap_backend_inflight") or 0.0,
    )


async def sample(pid: int, url: str, until_s: float, samples: list[tuple[float, ...]]) -> None:
    """(rss_mb, fds, tasks, streams in flight, ejections so far, outlier ejections so far) every second
    until until_s."""
    nan = float("nan")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < until_s:
            try:
                num_tasks, num_ejections, num_outlier, num_streams = await scrape_gateway(session, url)
            except (aiohttp.ClientError, TimeoutError):
                num_tasks, num_ejections, num_outlier, num_streams = nan, nan, nan, nan
            samples.append((proc_rss_mb(pid), proc_num_fds(pid), num_tasks, num_streams, num_ejections, num_outlier))
            await asyncio.sleep(1.0)


class PoolEvents:
    """The pool events in the new whole lines of the gateway's log since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        lines = whole.decode(errors="replace").splitlines()
        return [line for line in lines if any(event in line for event in POOL_EVENTS)]


def write_config(folder: Path, port: int, upstream_ports: list[int]) -> Path:
    path = folder / "config.toml"
    lines = [f'[server]\nport = {port}\napi_key = "{KEY}"\n[gateway]\nkey_store = "keys.db"\n[logging]\nlevel = "info"']
    for i, up in enumerate(upstream_ports):
        lines.append(f'[[backends]]\nname = "up{i}"\nurl = "http://127.0.0.1:{up}"\nmodel = "soak"')
    path.write_text("\n".join(lines) + "\n")
    return path


async def drive(opts: SoakOptions, gateway_pid: int, url: str, events: PoolEvents) -> SoakResult:
    result = SoakResult()
    t0_s = time.monotonic()
    end_s = t0_s + opts.duration_s
    tally = Tally(t0_s)
    samples: list[tuple[float, ...]] = []
    ejections_before = 0.0
    clients = asyncio.create_task(run_clients(url, opts.concurrency, end_s, random.Random(opts.seed), lambda: tally))
    sampler = asyncio.create_task(sample(gateway_pid, url, end_s + 1, samples))
    print(HEADER, flush=True)
    next_s = t0_s + opts.report_s
    while next_s <= end_s + 1e-6:
        await asyncio.sleep(max(0.0, next_s - time.monotonic()))
        done, tally, now_samples = tally, Tally(time.monotonic()), list(samples)
        samples.clear()
        done.span_s = time.monotonic() - done.start_s
        rss, fds, tasks, streams = (median_read(x) for x in list(zip(*now_samples, strict=True))[:4])
        ejections = max(read([s[4] for s in now_samples]), default=ejections_before)
        outlier = max(read([s[5] for s in now_samples]), default=result.num_outlier_ejections)
        result.num_outlier_ejections = max(result.num_outlier_ejections, outlier)
        report = Report(next_s - t0_s, done, rss, fds, tasks, ejections - ejections_before, streams)
        ejections_before = ejections
        result.reports.append(report)
        print(report.line(), flush=True)
        for example in done.examples[:2]:
            print(f"        e.g. {example}", flush=True)
        pool_events = events.new()
        for line in pool_events[:MAX_EVENTS_SHOWN]:
            print(f"        pool: {line}", flush=True)
        if len(pool_events) > MAX_EVENTS_SHOWN:
            print(f"        pool: ... and {len(pool_events) - MAX_EVENTS_SHOWN} more", flush=True)
        next_s += opts.report_s
    await clients  # each client ends its last request (bounded by its timeout)
    result.reports[-1].tally.merge(tally)
    sampler.cancel()
    judge(opts, result)
    return result


def read(values: Sequence[float]) -> list[float]:
    """The samples that were read: a scrape that failed is NaN (the only value not equal to itself)."""
    return [v for v in values if v == v]


def median_read(values: Sequence[float]) -> float:
    """The median of the samples that were read (a NaN in statistics.median's sort puts the median
    anywhere); NaN when none was."""
    done = read(values)
    return statistics.median(done) if done else float("nan")


def growth(values: list[float]) -> float:
    """Mean of the last quarter over the mean of the first quarter, minus 1 (idle keep-alive
    connections and the allocator make single readings noisy)."""
    n = max(1, len(values) // 4)
    return statistics.fmean(values[-n:]) / max(statistics.fmean(values[:n]), 1e-9) - 1


def judge(opts: SoakOptions, result: SoakResult) -> None:
    after = [r for r in result.reports if r.end_s > opts.warmup_s] or result.reports[-1:]
    result.rss_growth = growth([r.rss_mb for r in after])
    result.fds_growth = growth([r.num_fds for r in after])
    result.tasks_growth = growth([r.tasks_per_stream for r in after])
    total = Tally(0.0)
    for r in result.reports:
        total.merge(r.tally)
    if result.rss_growth >= GROWTH_LIMIT:
        result.failures.append(f"RSS grew {result.rss_growth:+.1%} after the warm-up (limit {GROWTH_LIMIT:.0%})")
    if result.fds_growth >= GROWTH_LIMIT:
        result.failures.append(f"open fds grew {result.fds_growth:+.1%} after the warm-up (limit {GROWTH_LIMIT:.0%})")
    if total.num_good_failed:
        result.failures.append(f"{total.num_good_failed} good requests failed, e.g. {total.examples[:3]}")
    if total.num_bad_5xx:
        result.failures.append(f"{total.num_bad_5xx} bad requests got a 5xx")
    if total.num_hung:
        result.failures.append(f"{total.num_hung} requests hung (no answer within their timeout)")
    if result.num_outlier_ejections:
        result.failures.append(f"{result.num_outlier_ejections:.0f} outlier ejections of equally noisy backends")
    print(
        f"\n{total.num_requests} requests ({total.summary()}); after the warm-up ({opts.warmup_s:g} s): "
        f"RSS x{1 + result.rss_growth:.3f}, open fds x{1 + result.fds_growth:.3f}, "
        f"tasks per stream x{1 + result.tasks_growth:.3f}, outlier ejections {result.num_outlier_ejections:.0f}"
    )
    print("targets: " + ("all held" if not result.failures else "MISSED: " + "; ".join(result.failures)))


def run_soak(opts: SoakOptions) -> SoakResult:
    """Start the upstreams and the gateway, drive the load, stop them; the gateway's log goes to
    stderr if it fails."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="zerogap-soak-") as tmp:
        folder = Path(tmp)
        up_ports, port = [free_port(), free_port()], free_port()
        timing = ["--ttft-s", str(opts.interval_s), "--interval-s", str(opts.interval_s)]
        procs = [  # their logs (aiohttp's tracebacks of requests the gateway hung up on) are not shown
            subprocess.Popen(
                [sys.executable, "-m", "tests.fixtures.upstream", "--port", str(p), "--model", "soak", *timing],
                cwd=repo,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for p in up_ports
        ]
        log = folder / "gateway.log"
        try:
            for p, proc in zip(up_ports, procs, strict=True):
                wait_for_port(p, 30, proc)
            with log.open("wb") as err:
                config = write_config(folder, port, up_ports)
                cmd = zerogap_command("gateway", "--config", str(config))
                gateway = subprocess.Popen(cmd, stdout=err, stderr=err, cwd=repo)
            procs.append(gateway)
            wait_for_port(port, 30, gateway)
            result = asyncio.run(drive(opts, gateway.pid, f"http://127.0.0.1:{port}", PoolEvents(log)))
        finally:
            for proc in procs:
                stop_process(proc, 10)
        if result.failures:
            sys.stderr.write(log.read_text(errors="replace")[-4000:])
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Soak the gateway: leaks, failed good requests, 5xx for bad ones.")
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--report-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=600.0, help="growth is measured from the first report after")
    p.add_argument("--interval-s", type=float, default=0.1, help="the upstreams' TTFT and gap between tokens")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    opts = SoakOptions(a.concurrency, a.duration_s, a.report_s, a.warmup_s, a.interval_s, a.seed)
    return 1 if run_soak(opts).failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
