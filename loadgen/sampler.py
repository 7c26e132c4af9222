"""One server-side timeline sample per call (loadreport/timeline.py's Sample): the backends'
signals (GPU utilization, running, waiting, KV cache...), their scheduler cap, and the zerogap
gateway's own in-flight figure, scraped side by side."""

from __future__ import annotations

import logging
import time

import gevent

from loadgen.gateway_inflight import GatewayInflight
from loadgen.metrics_discovery import metrics_urls
from loadgen.signals import (
    CPU_INTERVAL,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    TOKEN_INTERVAL,
    WAITING,
    GpuUtil,
    scheduler_cap,
    scrape_backends,
)
from loadreport.settings import MetricsSection
from loadreport.timeline import Sample

log = logging.getLogger("zerogap.loadtest")
DISCOVERY_TRIES = 10  # asks of the gateway for its backends, at one per sample, while it does not answer in time


class Sampler:
    """Takes one Sample per call; the caller runs it every sample_interval_ms. The backends scraped are
    settings.json's metrics.backend_metrics_urls or, where it is absent, those the zerogap gateway at
    gateway_url (the run's base URL) lists, asked once at the first sample; a zerogap gateway there
    also gives its own in-flight figure (loadgen/gateway_inflight.py)."""

    def __init__(self, metrics: MetricsSection, gateway_url: str | None = None) -> None:
        self.metrics = metrics
        self.gateway_url = gateway_url
        self.urls: list[str] | None = None  # found at the first sample
        self.gpu = GpuUtil(metrics)
        self.names = {
            RUNNING,
            WAITING,
            KV_USAGE,
            TOKEN_INTERVAL,
            CPU_INTERVAL,
            PREEMPTIONS,
            PREFIX_HITS,
            PREFIX_QUERIES,
        }
        self.names |= self.gpu.metric_names()
        self.samples: list[Sample] = []
        self.cap: int | None = None
        self.cap_tries = 3  # asked until known, a few times at most
        self.num_discovery_asks = 0
        self.gateway = GatewayInflight(gateway_url, metrics.gateway_metrics_key_env, metrics.scrape_timeout_seconds)

    def backend_urls(self) -> list[str]:
        """The backends' /metrics URLs, found once (and said in the log when the gateway was asked).
        A gateway that did not answer in time (or answered 5xx) is asked again at the next samples,
        DISCOVERY_TRIES times in all: one slow answer at the start must not cost the whole run its
        engine figures."""
        if self.urls is None:
            found = metrics_urls(self.metrics, self.gateway_url)
            self.num_discovery_asks += 1
            again = found.passing and self.num_discovery_asks < DISCOVERY_TRIES
            if found.asked:
                if found.urls:
                    log.info("zerogap: %s", found.note)
                elif again:  # said once, not at every sample
                    (log.warning if self.num_discovery_asks == 1 else log.debug)(
                        "zerogap: %s; asking again at the next sample", found.note
                    )
                elif found.passing:
                    log.warning("zerogap: %s; asked %d times, not asked again", found.note, self.num_discovery_asks)
                else:
                    log.warning("zerogap: %s", found.note)
            self.gpu.use_backends(found.urls, found.note)
            if again:
                return []
            self.urls = found.urls
        return self.urls

    def _cap(self, urls: list[str]) -> int | None:
        if self.cap is None and self.cap_tries > 0 and urls:
            self.cap_tries -= 1
            self.cap = scheduler_cap(urls, self.metrics.scrape_timeout_seconds)
        return self.cap

    def sample(self, users: int) -> Sample:
        urls = self.backend_urls()
        gateway = gevent.spawn(self.gateway.sample)  # beside the backends: one timeout bounds both
        scrape = scrape_backends(urls, self.names, self.metrics.scrape_timeout_seconds)
        gateway.join()
        wall = time.time()  # when the answers came: what they say is that recent (a busy server answers late)
        gpu, reason = self.gpu.sample(scrape)
        interval, cpu_interval = scrape.mean(TOKEN_INTERVAL), scrape.mean(CPU_INTERVAL)
        sample = Sample(
            wall=wall,
            users=users,
            gpu_util=None if gpu is None else round(gpu, 2),
            gpu_util_reason=reason,
            running=scrape.total(RUNNING),
            waiting=scrape.total(WAITING),
            kv_cache_usage=scrape.mean(KV_USAGE),
            token_interval_ms=None if interval is None else interval * 1000.0,
            preemptions_total=scrape.total(PREEMPTIONS),
            cpu_interval_ms=None if cpu_interval is None else cpu_interval * 1000.0,
            max_num_seqs=self._cap(urls),
            prefix_cache_hits=scrape.total(PREFIX_HITS),
            prefix_cache_queries=scrape.total(PREFIX_QUERIES),
            gateway_inflight=gateway.value,
        )
        self.samples.append(sample)
        return sample
