"""Traffic from files: settings.json's `workload.dataset` or `load_test.trace`, read when Locust starts
(a bad file stops the run before any request, naming its line) and made ready when a test starts
(ShareGPT replies counted, a trace's words checked against the engine's /tokenize)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from gevent.pool import Pool

from loadgen.dataset_source import Counter, DatasetBodies, choose, count_replies, request_payload
from loadgen.datasets import Dataset, read_dataset
from loadgen.replay import TraceReplay
from loadgen.run import Run
from loadgen.trace_prompts import TracePrompts, fit_vocabulary
from loadgen.traces import Trace, TraceRow, read_trace
from loadreport.schedule import LoadSchedule, Phase
from loadreport.settings import Settings

log = logging.getLogger("zerogap.loadtest")
COUNT_PARALLEL = 16  # ShareGPT replies counted at once by the engine's /tokenize
END_SLACK_S = 10.0  # a trace's run ends at its last send + api.timeout_seconds + this, at the latest


@dataclass
class Traffic:
    settings: Settings
    dataset: Dataset | None = None
    trace: Trace | None = None
    num_used: int = 0  # the dataset's items the run sends (dataset_limit)

    @classmethod
    def read(cls, settings: Settings) -> Traffic:
        """The files settings.json names, read and checked (DataFileError names the bad line)."""
        chat = settings.api.endpoint == "chat"
        w, load = settings.workload, settings.load_test
        dataset = read_dataset(w.dataset, chat, w.dataset_turns) if w.dataset else None
        trace = read_trace(load.trace, load.trace_block_tokens) if load.trace else None
        return cls(settings, dataset, trace)

    def api_path(self) -> str:
        """The endpoint: a JSONL dataset's bodies say it (chat or completions), else api.endpoint."""
        if self.dataset is not None:
            return "/v1/chat/completions" if self.dataset.chat else "/v1/completions"
        return self.settings.api.path()

    def schedule(self) -> LoadSchedule | None:
        """A trace's run: one open-loop step from the first send until the last request has ended
        (`cut` sets its end); None without a trace (the stepped schedule of load_test)."""
        if self.trace is None:
            return None
        load = self.settings.load_test
        span_s = self.trace.span_s / load.trace_speed
        rate = (len(self.trace.rows) - 1) / span_s if span_s > 0 else float(len(self.trace.rows))
        end_s = span_s + self.settings.api.timeout_seconds + END_SLACK_S
        return LoadSchedule((Phase(0, round(rate, 3), 0.0, end_s, 0.0),), True, load.concurrency, 0.0)

    def prepare(self, run: Run, counter: Counter | None, offset: int = 0) -> str:
        """Make the run ready to send the file's requests; returns how their tokens were counted.
        offset: this worker's index (its own sampling seed)."""
        if self.dataset is not None:
            run.bodies, tokens_from = self.dataset_bodies(run.model, counter, offset)
        else:
            run.replay, tokens_from = self.replay(run.model, counter)
            run.planned_lengths = self.planned_lengths()
        run.source = self.source(tokens_from)
        return tokens_from

    def dataset_bodies(self, model: str, counter: Counter | None, offset: int = 0) -> tuple[DatasetBodies, str]:
        """The bodies the users send, and how their max_tokens were counted."""
        assert self.dataset is not None
        w = self.settings.workload
        items = choose(self.dataset, w.dataset_order, w.dataset_seed + offset, w.dataset_limit)
        if any(turn.reply is not None for item in items for turn in item.turns):
            log.info("zerogap: counting the replies of %d conversations with the engine's tokenizer", len(items))
        tokens_from = count_replies(items, counter, Pool(COUNT_PARALLEL).imap)
        self.num_used = len(items)
        return DatasetBodies(self.settings, model, items), tokens_from

    def replay(self, model: str, counter: Counter | None) -> tuple[TraceReplay, str]:
        """The trace's replay (started when the users are), and how its prompts' token counts were checked."""
        assert self.trace is not None
        load = self.settings.load_test
        vocabulary, tokens_from = fit_vocabulary(counter, load.trace_block_tokens)
        if tokens_from != "tokenize":
            log.warning("zerogap: the trace's prompts use one word a token (the engine's /tokenize did not confirm it)")
        prompts = TracePrompts(load.trace_block_tokens, vocabulary)
        chat = self.chat

        def body(row: TraceRow) -> bytes:
            text = prompts.prompt(row)
            fields: dict[str, Any] = {"max_tokens": row.output_tokens}
            fields |= {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
            return json.dumps(request_payload(self.settings, model, fields)).encode()

        return TraceReplay(self.trace, load.trace_speed, body), tokens_from

    @property
    def chat(self) -> bool:
        return self.api_path().endswith("/chat/completions")

    def planned_lengths(self) -> dict[int, tuple[int, int]] | None:
        """A trace's (input, output) tokens by file line, for requests.csv."""
        if self.trace is None:
            return None
        return {row.line: (row.input_tokens, row.output_tokens) for row in self.trace.rows}

    def source(self, tokens_from: str) -> dict[str, Any] | None:
        """report.json's run.source."""
        if self.dataset is not None:
            d = self.dataset
            return {"kind": "dataset", "path": d.path, "format": d.format, "items": len(d.items), "used": self.num_used,
                    "skipped": d.skipped, "tokens_from": tokens_from}  # fmt: skip
        if self.trace is not None:
            t, speed = self.trace, self.settings.load_test.trace_speed
            return {"kind": "trace", "path": t.path, "format": t.format, "items": len(t.rows), "used": len(t.rows),
                    "skipped": t.skipped, "tokens_from": tokens_from, "trace_speed": speed,
                    "span_s": round(t.span_s / speed, 3)}  # fmt: skip
        return None
