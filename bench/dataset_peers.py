"""Bring your own traffic, side by side with the peers (issue 39): the same ShareGPT file through
`vllm bench serve` and through the harness, and the same Mooncake trace through AIPerf and through
the harness, each against a fresh simulated engine (`zerogap sim`), round after round.

    .venv/bin/python -m bench.dataset_peers [--rounds 3] [--only sharegpt|mooncake] [--time-scale 5]

Both files are made here, deterministically: ShareGPT conversations of a human turn (16-200 words)
and a reply (8-80 words); a Mooncake trace of Poisson arrivals (--trace-rate req/s for
--trace-seconds), each prompt two of 8 shared 512-token blocks (a group's system prompt) then
64-700 tokens of its own, outputs 16-96 tokens. `vllm bench serve` (the vLLM environment,
scripts/setup-vllm) and the harness run the ShareGPT file closed-loop at --streams streams (every
conversation once for vLLM's client, --per-stream of them a stream; the harness for as long, round and
round; the sim without its prefix cache, or the harness's second pass would find its prompts cached);
AIPerf 0.13
(installed on first use into its own environment, ZEROGAP_BENCH_AIPERF or
~/.cache/zerogap/bench-aiperf) and the harness replay the trace at its times (AIPerf's
--fixed-schedule).

The peers need the engine's tokenizer to size prompts and count replies: the sim's is one
whitespace-separated word a token, so the bench writes that as a Hugging Face tokenizer (a WordLevel
model on whitespace, no special tokens), and both peers count what the sim counts. AIPerf 0.13
cannot load a tokenizer from a folder in its prompt workers (they set HF_HUB_OFFLINE and resolve the
name as a hub repo id: "Repo id must be in the form 'repo_name'"), so the bench lays the tokenizer
out as a cached hub repo (`zerogap/sim-words`) under a HF_HOME of its own.

Each tool's run gets a sim of its own (no prefix cache or histogram carried over), whose /metrics is
read when the run is over: the prompt and output tokens it served, its prefix-cache hits, and its own
TTFT (vllm:time_to_first_token_seconds, sum / count) of the very requests that tool sent. Figures:
output TPS and TPOT p50 as each tool reports them (vLLM's client and AIPerf over their whole run;
the harness over its step's window; a trace's step is the whole replay); TTFT mean of all the
tool's requests (the harness's from requests.csv) beside the sim's mean of the same requests.
vLLM's client's TPS counts its ramp and its tail (the last conversations end one by one): about
1/(2 x per-stream) below the steady state, 7% at 10 a stream, hence 30.

Prints each round, then the medians with their ranges and the verdicts of issue 39: harness / peer
within 5% for output TPS and TPOT p50, and the harness's TTFT at least as near the sim's own as the
peer's is (|harness - sim| <= |peer - sim|, medians over rounds). Exit 1 when one misses.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import urllib.request
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import backends.vllm.entry as vllm_entry
from bench._report import spread
from common.net import free_port, wait_http_ok
from common.process_group import stop_process

REPO = Path(__file__).resolve().parent.parent
MODEL = "sim-model"
TOLERANCE = 0.05
AIPERF_VENV = Path(os.environ.get("ZEROGAP_BENCH_AIPERF", Path.home() / ".cache" / "zerogap" / "bench-aiperf"))
AIPERF_REQUIREMENT = "aiperf==0.13.0"
HUB_REPO = "zerogap/sim-words"  # the word tokenizer, as AIPerf's workers can load it
HUB_REVISION = "0" * 40
BLOCK = 512
SIM_METRICS = ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
               "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total")  # fmt: skip
WORDS = (
    "the engine steps forward token interval batch slot reuse async schedule prefill decode cache block "
    "prefix stream queue gpu busy idle kernel memory latency throughput request model layer head tensor "
    "quick brown fox jumps over lazy dog river mountain cloud signal pattern window garden harbor lantern"
).split()


# ----- the engine's tokenizer, for the peers -----
def write_word_tokenizer(folder: Path) -> Path:
    """A Hugging Face tokenizer that counts as the sim does: one whitespace-separated word, one token
    (a WordLevel model: a word it does not know is its `unk`, still one token), no BOS or EOS added."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"unk": 0} | {word: i + 1 for i, word in enumerate(dict.fromkeys(WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="unk"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "unk", "model_max_length": 1_000_000,
              "clean_up_tokenization_spaces": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def as_cached_hub_repo(tokenizer: Path, hf_home: Path) -> str:
    """The tokenizer laid out as a cached hub repo under hf_home; its repo id."""
    repo = hf_home / "hub" / ("models--" + HUB_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / HUB_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(HUB_REVISION, encoding="utf-8")
    for item in tokenizer.iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    return HUB_REPO


# ----- the files -----
def make_sharegpt(path: Path, num: int, seed: int = 39) -> dict[str, int]:
    """ShareGPT conversations: a human turn, then the reply (its length sets max_tokens)."""
    rng = random.Random(seed)
    items = []
    prompt_words = reply_words = 0
    for k in range(num):
        prompt = [rng.choice(WORDS) for _ in range(rng.randint(16, 200))]
        reply = [rng.choice(WORDS) for _ in range(rng.randint(8, 80))]
        prompt_words, reply_words = prompt_words + len(prompt), reply_words + len(reply)
        items.append({"id": f"conv{k}", "conversations": [{"from": "human", "value": " ".join(prompt)},
                                                          {"from": "gpt", "value": " ".join(reply)}]})  # fmt: skip
    path.write_text(json.dumps(items), encoding="utf-8")
    return {"items": num, "prompt_tokens": prompt_words, "output_tokens": reply_words}


def make_mooncake(path: Path, rate: float, seconds: float, seed: int = 39) -> dict[str, int]:
    """Poisson arrivals; each prompt a group's two shared blocks (4 groups), then its own block, cut short."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    at = 0.0
    while at < seconds:
        group, own = rng.randrange(4), rng.randint(64, 700)
        hash_ids = [2 * group, 2 * group + 1, *(1000 + 2 * len(rows) + b for b in range(-(-own // BLOCK)))]
        rows.append({"timestamp": round(at * 1000), "input_length": 2 * BLOCK + own,
                     "output_length": rng.randint(16, 96), "hash_ids": hash_ids})  # fmt: skip
        at += rng.expovariate(rate)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return {"items": len(rows), "prompt_tokens": sum(r["input_length"] for r in rows),
            "output_tokens": sum(r["output_length"] for r in rows)}  # fmt: skip


# ----- the sim -----
def sim_counters(url: str) -> dict[str, float]:
    """SIM_METRICS from the sim's /metrics, each summed over its label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys(SIM_METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class Served:
    """What the sim saw of one tool's run."""

    ttft_mean_ms: float = float("nan")
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cache_hits: int = 0


@contextmanager
def sim(work: Path, time_scale: float, served: Served, prefix_caching: bool = True) -> Iterator[str]:
    """A fresh sim for one tool's run; `served` is filled from its /metrics when the run is over."""
    config = work / "sim.toml"
    config.write_text("# every [sim] and [engine] setting at its default\n", encoding="utf-8")
    port = free_port()
    zerogap = str(Path(sys.executable).with_name("zerogap"))
    cmd = [
        zerogap,
        "sim",
        "--config",
        str(config),
        "--port",
        str(port),
        "--model",
        MODEL,
        "--time-scale",
        str(time_scale),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/v1/models", 60)
        yield url
        end = sim_counters(url)
        count = end["vllm:time_to_first_token_seconds_count"]
        served.requests = int(count)
        served.ttft_mean_ms = 1000 * end["vllm:time_to_first_token_seconds_sum"] / count if count else float("nan")
        served.prompt_tokens = int(end["vllm:prompt_tokens_total"])
        served.output_tokens = int(end["vllm:generation_tokens_total"])
        served.cache_hits = int(end["vllm:prefix_cache_hits_total"])
    finally:
        stop_process(proc)


# ----- the tools -----
@dataclass
class Figures:
    tool: str
    output_tps: float
    tpot_p50_ms: float
    ttft_p50_ms: float
    ttft_mean_ms: float
    requests: int
    cpu_s: float = 0.0  # the tool's own CPU seconds (its process tree)
    served: Served = field(default_factory=Served)

    @property
    def ttft_gap_ms(self) -> float:
        """The tool's TTFT over the sim's own, same requests (mean)."""
        return self.ttft_mean_ms - self.served.ttft_mean_ms


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run a tool to its end; its output and CPU seconds. Exits with its output's tail when it fails."""
    cpu0 = children_cpu_s()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout, children_cpu_s() - cpu0


def vllm_python() -> str:
    """ZEROGAP_VLLM_PYTHON, else scripts/setup-vllm (installs vLLM's CPU build once)."""
    python = os.environ.get("ZEROGAP_VLLM_PYTHON")
    if python:
        return python
    done = subprocess.run([str(REPO / "scripts" / "setup-vllm")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"scripts/setup-vllm failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def run_vllm_sharegpt(
    python: str, url: str, tokenizer: Path, data: Path, num: int, streams: int, out: Path
) -> tuple[Figures, float]:
    """`vllm bench serve --dataset-name sharegpt`: every conversation once, at most `streams` at a time; its
    figures and its run's duration (from its first request to its last answer)."""
    argv = [
        python, vllm_entry.__file__, vllm_entry.CLI_FLAG, "bench", "serve", "--backend", "openai-chat",
        "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", MODEL, "--tokenizer", str(tokenizer),
        "--dataset-name", "sharegpt", "--dataset-path", str(data), "--num-prompts", str(num), "--ignore-eos",
        "--max-concurrency", str(streams), "--request-rate", str(streams), "--seed", "1",
        "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50", "--disable-tqdm",
        "--save-result", "--result-dir", str(out), "--result-filename", "vllm-bench.json",
    ]  # fmt: skip
    _, cpu_s = run_tool(argv, 600)
    result: dict[str, Any] = json.loads((out / "vllm-bench.json").read_text(encoding="utf-8"))
    if result["completed"] != num or result["failed"]:
        sys.exit(f"vllm bench serve completed {result['completed']} of {num}, {result['failed']} failed")
    figures = Figures("vllm bench serve", result["output_throughput"], result["median_tpot_ms"],
                      result["median_ttft_ms"], result["mean_ttft_ms"], result["completed"], cpu_s)  # fmt: skip
    return figures, float(result["duration"])


def install_aiperf() -> Path:
    executable = AIPERF_VENV / "bin" / "aiperf"
    if not executable.exists():
        if not (AIPERF_VENV / "bin" / "python").exists():
            venv.create(AIPERF_VENV, with_pip=True)
        print(f"installing {AIPERF_REQUIREMENT} into {AIPERF_VENV} (once)", file=sys.stderr, flush=True)
        cmd = [str(AIPERF_VENV / "bin" / "python"), "-m", "pip", "install", "-q", AIPERF_REQUIREMENT]
        if subprocess.run(cmd, check=False).returncode != 0 or not executable.exists():
            sys.exit(f"could not install {AIPERF_REQUIREMENT} into {AIPERF_VENV}")
    return executable


def run_aiperf_mooncake(aiperf: Path, url: str, hf_home: Path, trace: Path, out: Path) -> Figures:
    """AIPerf's Mooncake replay at the trace's times (fixed schedule), the sim's usage as token counts."""
    argv = [
        str(aiperf), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", HUB_REPO, "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
        "--fixed-schedule", "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
        "--random-seed", "1", "--artifact-dir", str(out), "--ui", "none",
    ]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    _, cpu_s = run_tool(argv, 600, env)
    result: dict[str, Any] = json.loads((out / "profile_export_aiperf.json").read_text(encoding="utf-8"))

    def metric(name: str, stat: str = "avg") -> float:
        return float(result[name][stat])

    if metric("request_error_rate"):
        sys.exit(f"AIPerf: {metric('request_error_rate')}% of requests failed: {result.get('error_summary')}")
    return Figures("AIPerf", metric("output_token_throughput"), metric("inter_token_latency", "p50"),
                   metric("time_to_first_token", "p50"), metric("time_to_first_token"),
                   int(metric("request_count")), cpu_s)  # fmt: skip


def run_harness(url: str, work: Path, name: str, load_test: dict[str, Any], workload: dict[str, Any]) -> Figures:
    """The real `locust -f loadtest/ --headless`, one process."""
    settings = {
        "api": {"base_url": url, "api_key_env": "", "endpoint": "chat"},
        "load_test": load_test,
        "workload": {"model": MODEL, "ignore_eos": True, **workload},
        "metrics": {"exporter_port": 0, "backend_metrics_urls": [], "gpu_util": {"source": "none"}},
        "output": {"dir": str(work / "runs"), "run_name": name},
    }
    path = work / f"{name}.json"
    path.write_text(json.dumps(settings), encoding="utf-8")
    locust = str(Path(sys.executable).with_name("locust"))
    _, cpu_s = run_tool([locust, "-f", str(REPO / "loadtest"), "--headless", "--settings", str(path)], 900)
    run_dir = work / "runs" / name
    (step,) = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))["steps"]
    with (run_dir / "requests.csv").open(newline="", encoding="utf-8") as source:
        ttfts = [float(row["ttft_ms"]) for row in csv.DictReader(source) if row["ttft_ms"]]
    if step["requests_failed"]:
        sys.exit(f"the harness: {step['requests_failed']} requests failed: {step['errors']}")
    return Figures("harness", step["output_tps"], step["tpot_ms"]["p50"], step["ttft_ms"]["p50"],
                   statistics.fmean(ttfts), len(ttfts), cpu_s)  # fmt: skip


# ----- a round -----
@dataclass
class Pair:
    source: str  # sharegpt | mooncake
    peer: Figures
    ours: Figures


def sharegpt_pair(args: argparse.Namespace, work: Path, tokenizer: Path, data: Path, num: int, index: int) -> Pair:
    served_peer, served_ours = Served(), Served()
    # No prefix cache: vLLM's client sends each conversation once, the harness round and round for as long;
    # with the cache, the harness's second pass would find its prompts cached and the engine would run faster.
    with sim(work, args.time_scale, served_peer, prefix_caching=False) as url:
        peer, peer_s = run_vllm_sharegpt(args.vllm_python, url, tokenizer, data, num, args.streams, work)
    step_s = max(12, round(peer_s))  # the harness runs as long as vLLM's client did, its first 2 s unmeasured
    load_test = {"steps": [args.streams], "spawn_rate": args.streams, "warmup_seconds": 2,
                 "step_duration_seconds": step_s, "measure_last_seconds": step_s - 2}  # fmt: skip
    workload = {"dataset": str(data), "dataset_order": "random", "dataset_seed": index}
    with sim(work, args.time_scale, served_ours, prefix_caching=False) as url:
        ours = run_harness(url, work, f"sharegpt{index}", load_test, workload)
    peer.served, ours.served = served_peer, served_ours
    return Pair("sharegpt", peer, ours)


def mooncake_pair(args: argparse.Namespace, work: Path, hf_home: Path, trace: Path, index: int) -> Pair:
    served_peer, served_ours = Served(), Served()
    with sim(work, args.time_scale, served_peer) as url:
        peer = run_aiperf_mooncake(args.aiperf, url, hf_home, trace, work / f"aiperf{index}")
    with sim(work, args.time_scale, served_ours) as url:
        ours = run_harness(url, work, f"mooncake{index}", {"trace": str(trace), "concurrency": 128}, {})
    peer.served, ours.served = served_peer, served_ours
    return Pair("mooncake", peer, ours)


def print_pair(pair: Pair, expected: dict[str, int]) -> None:
    print(f"  {pair.source}: {expected['items']} items, {expected['prompt_tokens']:,} prompt and "
          f"{expected['output_tokens']:,} output tokens in the file", flush=True)  # fmt: skip
    for f in (pair.peer, pair.ours):
        s = f.served
        print(f"    {f.tool:<17} output {f.output_tps:8.1f} tok/s  TPOT p50 {f.tpot_p50_ms:6.2f} ms  TTFT p50 "
              f"{f.ttft_p50_ms:7.2f} ms, mean {f.ttft_mean_ms:7.2f} ms (sim's own {s.ttft_mean_ms:7.2f} ms: "
              f"{f.ttft_gap_ms:+.2f})  {f.requests} requests; sim served {s.requests} requests, {s.prompt_tokens:,} "
              f"prompt / {s.output_tokens:,} output tokens, {s.cache_hits:,} cached; CPU {f.cpu_s:.1f} s",
              flush=True)  # fmt: skip


# ----- the verdict -----
def verdicts(pairs: list[Pair]) -> list[tuple[str, bool]]:
    """Each figure's line (medians over rounds, with ranges) and whether it is within issue 39's bound."""
    lines = []
    for source in dict.fromkeys(p.source for p in pairs):
        mine = [p for p in pairs if p.source == source]
        peer = mine[0].peer.tool
        for name, label in (("output_tps", "output TPS"), ("tpot_p50_ms", "TPOT p50")):
            ratios = [getattr(p.ours, name) / getattr(p.peer, name) for p in mine]
            ok = abs(statistics.median(ratios) - 1) <= TOLERANCE
            lines.append((f"{source}: {label} harness / {peer}: {spread(ratios, '', 3)} "
                          f"(bound 1 +- {TOLERANCE:g})", ok))  # fmt: skip
        ours_gap = [p.ours.ttft_gap_ms for p in mine]
        peer_gap = [p.peer.ttft_gap_ms for p in mine]
        ok = abs(statistics.median(ours_gap)) <= abs(statistics.median(peer_gap))
        lines.append((f"{source}: TTFT mean over the sim's own: harness {spread(ours_gap, ' ms')}, {peer} "
                      f"{spread(peer_gap, ' ms')} (bound: the harness at least as near)", ok))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("sharegpt", "mooncake"), default=None)
    parser.add_argument("--time-scale", type=float, default=5.0, help="the sim's (default 5: a step of ~46 ms at 32)")
    parser.add_argument("--streams", type=int, default=32, help="ShareGPT: concurrent streams (default 32)")
    parser.add_argument("--per-stream", type=int, default=30, help="ShareGPT: conversations per stream (default 30)")
    parser.add_argument("--trace-rate", type=float, default=4.0, help="Mooncake: arrivals per second (default 4)")
    parser.add_argument("--trace-seconds", type=float, default=40.0, help="Mooncake: the trace's span (default 40)")
    args = parser.parse_args(argv)
    sources = [args.only] if args.only else ["sharegpt", "mooncake"]
    args.vllm_python = vllm_python() if "sharegpt" in sources else ""
    args.aiperf = install_aiperf() if "mooncake" in sources else None
    pairs: list[Pair] = []
    with tempfile.TemporaryDirectory(prefix="zerogap-dataset-peers-") as tmp:
        work = Path(tmp)
        tokenizer = write_word_tokenizer(work / "tokenizer")
        hf_home = work / "hf"
        as_cached_hub_repo(tokenizer, hf_home)
        num = args.streams * args.per_stream
        sharegpt = make_sharegpt(work / "sharegpt.json", num)
        mooncake = make_mooncake(work / "mooncake.jsonl", args.trace_rate, args.trace_seconds)
        print(f"the sim at --time-scale {args.time_scale:g}; ShareGPT closed loop at {args.streams} streams; "
              f"Mooncake trace {mooncake['items']} rows over {args.trace_seconds:g} s", flush=True)  # fmt: skip
        for index in range(args.rounds):
            print(f"round {index + 1}", flush=True)
            if "sharegpt" in sources:
                pairs.append(sharegpt_pair(args, work, tokenizer, work / "sharegpt.json", num, index))
                print_pair(pairs[-1], sharegpt)
            if "mooncake" in sources:
                pairs.append(mooncake_pair(args, work, hf_home, work / "mooncake.jsonl", index))
                print_pair(pairs[-1], mooncake)
    print(f"medians over {args.rounds} rounds [range]:")
    missed = False
    for line, ok in verdicts(pairs):
        print(f"  {'PASS' if ok else 'FAIL'}  {line}")
        missed |= not ok
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
