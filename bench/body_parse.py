"""What decoding a request body costs the event loop, per body shape, for each candidate side by side.

Shapes: 4 MiB worst cases (issue 35: nested lists 61 deep, many tiny arrays or objects, small
integers, token ids, floats, strings of escapes, surrogate pairs, many keys, one long text), the
largest bodies within the gateway's budget (gateway/server/body_scan.py), and ordinary chat bodies.
Columns, milliseconds of event-loop time per body: the CPU time of the thread that decodes (on a
busy machine the wall clock adds the waits for a core; --clock wall for it), best of --repeat, the
value freed included:
  json      Python's json with the gateway's previous hooks (NaN, overflow): the old decoder's core
  prev      with --previous FILE: that file's decode_object (the gateway's strict_json.py of an
            earlier commit, which decoded every body whatever its shape)
  orjson    orjson.loads alone, no gateway check (if orjson is installed; not a dependency)
  msgspec   msgspec's decoder alone, no budget
  thread    msgspec in a worker thread: the loop's longest stall meanwhile (a 1 ms ticker's
            lateness): the GIL is held through the whole C call, so a thread frees nothing
  scan      the new path's scan of the body in 64 KiB chunks, as read_body makes it: the
            longest chunk's time (the loop's step), then `+` the total over the chunks
  new       decode_object on the scanned body (the budget's refusal, or msgspec and the checks),
            then the walk for integers beyond 64 bits where the scan calls for it

    git show a200f7e:gateway/strict_json.py > /tmp/prev_strict_json.py  # before issue 35
    .venv/bin/python -m bench.body_parse [--repeat 5] [--quick] [--previous /tmp/prev_strict_json.py] [--clock wall]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.server import json_errors
from gateway.server.body_scan import MAX_CONTAINERS, MAX_VALUES, BodyScan, ScannedBody
from gateway.server.errors import ApiError
from gateway.server.strict_json import decode_object, int64_outside

try:
    import orjson  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # not a dependency: the column is left out
    orjson = None

MiB = 1 << 20
CLOCK = time.thread_time
CHUNK = 64 * 1024  # uvicorn hands the body on in pieces of about this size (its high-water mark)
HEAD = b'{"model":"nope","messages":[{"role":"user","content":"hi"}],"x":'
_MSGSPEC = msgspec.json.Decoder()


def filled(unit: bytes, size: int = 4 * MiB) -> bytes:
    count = (size - len(HEAD) - 3) // (len(unit) + 1)
    return HEAD + b"[" + b",".join([unit] * count) + b"]}"


def counted(unit: bytes, count: int) -> bytes:
    return HEAD + b"[" + b",".join([unit] * count) + b"]}"


def chat(size: int) -> bytes:
    message = {"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 20}
    body = {"model": "nope", "messages": [message] * max(1, size // 950), "temperature": 0.7, "stream": True}
    return json.dumps(body).encode()


def shapes() -> dict[str, bytes]:
    chain = b"[" * 61 + b"]" * 61
    return {
        "4M deep61": filled(chain),
        "4M [] x1.4M": filled(b"[]"),
        "4M {} x1.4M": filled(b"{}"),
        "4M ints": filled(b"0"),
        "4M token ids": filled(b"123456"),
        "4M floats": filled(b"0.125"),
        "4M escapes": HEAD + b'"' + b"\\n" * (2 * MiB - 50) + b'"}',
        "4M surrogates": HEAD + b'"' + b"\\ud83d\\ude00" * (MiB // 3 - 10) + b'"}',
        "4M keys": HEAD + b"{" + b",".join(b'"k%d":0' % i for i in range(380_000)) + b"}}",
        "4M text": HEAD + b'"' + b"The quick brown fox, [jumps] {over} the lazy dog. " * (4 * MiB // 52) + b'"}',
        "max token ids": counted(b"123456", MAX_VALUES - 16),
        "max floats": counted(b"0.125", MAX_VALUES - 16),
        "max 19-digit": counted(b"9123456789012345678", MAX_VALUES - 16),
        "max strings": counted(b'"ab"', MAX_VALUES - 16),
        "max []": counted(b"[]", MAX_CONTAINERS - 16),
        "max deep61": counted(chain, (MAX_CONTAINERS - 16) // 61),
        "max {k:v}": counted(b'{"a":1}', MAX_CONTAINERS - 16),
        "chat 1 KiB": chat(1024),
        "chat 10 KiB": chat(10 * 1024),
        "chat 100 KiB": chat(100 * 1024),
    }


def best_ms(run: Callable[[], Any], repeat: int) -> float:
    """The shortest of `repeat` runs, the result freed inside the timing (as it is on the loop)."""
    best = float("inf")
    for _ in range(repeat):
        start = CLOCK()
        try:
            result = run()
        except (ApiError, ValueError, msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            result = exc
        del result
        best = min(best, CLOCK() - start)
    return best * 1000


def scan_ms(raw: bytes, repeat: int) -> tuple[float, float, ScannedBody]:
    """The longest chunk's scan and the total, best of `repeat`; and the scanned body."""
    longest = total = float("inf")
    for _ in range(repeat):
        scan, steps = BodyScan(), []
        for start in range(0, len(raw), CHUNK):
            chunk = raw[start : start + CHUNK]
            began = CLOCK()
            scan.feed(chunk)
            steps.append(CLOCK() - began)
        longest, total = min(longest, max(steps)), min(total, sum(steps))
    return longest * 1000, total * 1000, ScannedBody(raw, scan)


def thread_stall_ms(raw: bytes) -> float:
    """The loop's longest stall while a worker thread decodes `raw` (a ticker every 1 ms)."""

    async def measure() -> float:
        loop = asyncio.get_running_loop()
        done = threading.Event()
        stall = 0.0

        async def tick() -> None:
            nonlocal stall
            while not done.is_set():
                began = time.perf_counter()
                await asyncio.sleep(0.001)
                stall = max(stall, time.perf_counter() - began - 0.001)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.01)
        stall = 0.0
        try:
            await loop.run_in_executor(None, lambda: best_ms(lambda: _MSGSPEC.decode(raw), 1))
        finally:
            done.set()
            await ticker
        return stall * 1000

    return asyncio.run(measure())


def previous(path: str) -> Callable[[bytes], Any]:
    """decode_object of a strict_json.py of an earlier commit, loaded from `path`."""
    spec = importlib.util.spec_from_file_location("previous_strict_json", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decode_object


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of the slow candidates on 4 MiB bodies")
    parser.add_argument("--previous", help="an earlier commit's gateway/server/strict_json.py, as a column")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    before = previous(args.previous) if args.previous else None
    names = ["json", *(["prev"] if before else []), *(["orjson"] if orjson else []), "msgspec", "thread", "scan", "new"]
    print(f"{'shape':15} {'KiB':>5} " + " ".join(f"{n:>13}" for n in names) + "  new's answer")
    for name, raw in shapes().items():
        slow = 1 if args.quick and len(raw) > MiB else args.repeat
        print(f"{name:15} {len(raw) // 1024:5} " + row(raw, args.repeat, slow, before), flush=True)


def row(raw: bytes, repeat: int, slow: int, before: Callable[[bytes], Any] | None) -> str:
    """One shape's cells: the candidates' milliseconds, then what the new path answered."""
    cells = [best_ms(lambda: json_errors._JSON.decode(raw.decode()), slow)]
    if before:
        cells.append(best_ms(lambda: before(raw), slow))
    if orjson:
        cells.append(best_ms(lambda: orjson.loads(raw), slow))
    cells += [best_ms(lambda: _MSGSPEC.decode(raw), slow), thread_stall_ms(raw)]
    longest, total, scanned = scan_ms(raw, repeat)
    new = best_ms(lambda: int64_outside(decode_object(scanned), scanned), repeat)
    try:
        decode_object(scanned)
        answer = "decoded"
    except ApiError as exc:
        answer = f"{exc.status} {exc.message[:38]}"
    shown = [f"{v:13.2f}" for v in cells] + [f"{longest:6.2f}+{total:6.1f}", f"{new:13.2f}"]
    return " ".join(shown) + f"  {answer}"


if __name__ == "__main__":
    main()
