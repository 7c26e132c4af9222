"""Traces to replay (settings.json `load_test.trace`), read and checked before the run starts.

- Mooncake JSONL: one request a line, {"timestamp": ms, "input_length": tokens, "output_length":
  tokens, "hash_ids": [ids of the prompt's blocks of `trace_block_tokens` (512) tokens]}. Equal ids
  are equal blocks of text, so prefix sharing in the trace is prefix sharing on the engines.
- BurstGPT CSV: the columns `Timestamp` (seconds), `Request tokens` and `Response tokens` (others,
  such as Model and Log Type, are read past). Rows with 0 response tokens (failed in the original
  service) or 0 request tokens are skipped and counted.

Times are taken from the trace's first request (a trace whose first timestamp is 27,000 ms starts at
once); rows are replayed in time order. A file that cannot be used raises DataFileError naming the line.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.datasets import DataFileError

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
EXAMPLE = '{"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [0, 1]}'


@dataclass(frozen=True)
class TraceRow:
    index: int  # the row's place in time order, from 0
    line: int  # in the file (1-based)
    at_s: float  # from the trace's first request, before trace_speed
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    path: str
    format: str  # "mooncake" or "burstgpt"
    rows: list[TraceRow]
    skipped: int = 0

    @property
    def span_s(self) -> float:
        """From the first request to the last, before trace_speed."""
        return self.rows[-1].at_s if self.rows else 0.0


def read_trace(path: str | Path, block_tokens: int = 512) -> Trace:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataFileError(f"{file}: cannot read it ({exc.strerror or exc}). Check load_test.trace.") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{file}: not UTF-8 text (byte {exc.start}). Save it as UTF-8.") from None
    if file.suffix == ".csv" or (file.suffix != ".jsonl" and not text.lstrip().startswith("{")):
        every, fmt = _read_burstgpt(file, text), "burstgpt"
        rows = [row for row in every if row[2] > 0 and row[3] > 0]  # 0 response tokens: failed in the original
        skipped = len(every) - len(rows)
    else:
        rows, skipped, fmt = _read_mooncake(file, text, block_tokens), 0, "mooncake"
    if not rows:
        raise DataFileError(f"{file}: no request in it{f' ({skipped} skipped)' if skipped else ''}; e.g. {EXAMPLE}")
    rows.sort(key=lambda r: r[1])  # stable: rows of one time keep the file's order
    first = rows[0][1]
    ordered = [
        TraceRow(i, line, round(at - first, 6), inp, out, ids) for i, (line, at, inp, out, ids) in enumerate(rows)
    ]
    return Trace(str(file), fmt, ordered, skipped)


_Row = tuple[int, float, int, int, tuple[int, ...]]  # line, seconds, input, output, hash_ids


def _whole(value: Any, name: str, where: str, low: int = 1) -> int:
    if type(value) is not int or value < low:
        raise DataFileError(f"{where}: {name} must be a whole number >= {low} (got {json.dumps(value)})")
    return int(value)


def _read_mooncake(file: Path, text: str, block_tokens: int) -> list[_Row]:
    rows: list[_Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line is one request, e.g. {EXAMPLE}"
            ) from None
        if not isinstance(obj, dict):
            raise DataFileError(f"{where}: a line must be a JSON object, e.g. {EXAMPLE}")
        for name in ("timestamp", "input_length", "output_length"):
            if name not in obj:
                raise DataFileError(f"{where}: no {name}; each line needs timestamp (ms), input_length, output_length")
        stamp = obj["timestamp"]
        if type(stamp) not in (int, float) or not math.isfinite(stamp) or stamp < 0:
            raise DataFileError(f"{where}: timestamp must be milliseconds >= 0 (got {json.dumps(stamp)})")
        num_input = _whole(obj["input_length"], "input_length", where)
        num_output = _whole(obj["output_length"], "output_length", where)
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise DataFileError(f"{where}: hash_ids must be a list of whole numbers (got {json.dumps(ids)[:80]})")
        num_blocks = math.ceil(num_input / block_tokens)
        if len(ids) > num_blocks:
            raise DataFileError(
                f"{where}: {len(ids)} hash_ids, but input_length {num_input} fills only {num_blocks} blocks of "
                f"{block_tokens} tokens (load_test.trace_block_tokens)"
            )
        rows.append((number, float(stamp) / 1000.0, num_input, num_output, tuple(ids)))
    return rows


def _read_burstgpt(file: Path, text: str) -> list[_Row]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise DataFileError(f"{file}: empty; a BurstGPT CSV starts with its header: Timestamp,...,Request tokens,...")
    names = [name.strip() for name in header]
    missing = [name for name in BURSTGPT_COLUMNS if name not in names]
    if missing:
        raise DataFileError(
            f"{file}:1: the header has no {', '.join(missing)} column; a BurstGPT CSV has "
            f"{', '.join(BURSTGPT_COLUMNS)} (found: {', '.join(names)[:200]})"
        )
    at, inp, out = (names.index(name) for name in BURSTGPT_COLUMNS)
    rows: list[_Row] = []
    for number, fields in enumerate(reader, start=2):
        if not fields or not "".join(fields).strip():
            continue
        where = f"{file}:{number}"
        if len(fields) < len(names):
            raise DataFileError(f"{where}: {len(fields)} fields, the header has {len(names)}")
        try:
            stamp = float(fields[at])
        except ValueError:
            raise DataFileError(f"{where}: Timestamp {fields[at]!r} is not a number of seconds") from None
        if not math.isfinite(stamp) or stamp < 0:
            raise DataFileError(f"{where}: Timestamp {fields[at]!r} must be seconds >= 0")
        counts = []
        for column, value in ((BURSTGPT_COLUMNS[1], fields[inp]), (BURSTGPT_COLUMNS[2], fields[out])):
            try:
                counts.append(int(value))
            except ValueError:
                raise DataFileError(f"{where}: {column} {value!r} is not a whole number") from None
            if counts[-1] < 0:
                raise DataFileError(f"{where}: {column} {value!r} is below 0")
        rows.append((number, stamp, counts[0], counts[1], ()))
    return rows
