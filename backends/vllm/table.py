"""The launcher's table: for each setting, what config.toml asked, what vLLM reports it
runs with, and whether that is the setting in force, vLLM's own default, or something
this vLLM or platform cannot honour."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.vllm.command import FLAGS
from backends.vllm.startup_report import StartupReport

IN_FORCE = "in force"
DEFAULT = "vLLM default"
CANNOT = "cannot honour here"
NOT_REPORTED = "not reported"

SECTIONS = {name: section for name, (section, _) in FLAGS.items()} | {
    "overlap_token_interval": "token_interval",
    "detokenizer_async": "token_interval",
    "slot_reuse": "token_interval",
    "enable_prefix_caching": "(vLLM only)",
}
_DTYPE_ALIASES = {"float": "float32", "half": "float16"}


@dataclass(frozen=True)
class Row:
    setting: str
    asked: Any  # None: config.toml leaves it out
    runs_with: Any  # None: vLLM did not report it
    status: str
    note: str = ""


def _same(setting: str, asked: Any, got: Any) -> bool:
    if setting == "dtype":
        return asked == "auto" or _DTYPE_ALIASES.get(asked, asked) == got
    if isinstance(asked, float) or isinstance(got, float):
        return abs(float(asked) - float(got)) < 1e-9
    return bool(asked == got)


def _why_not(setting: str, asked: Any, got: Any, report: StartupReport) -> str:
    overlap = setting in ("async_scheduling", "overlap_token_interval")
    if overlap and asked and report.reported.get("device") == "cpu":
        return "the CPU backend turns async scheduling off"
    if overlap and asked:
        return "this vLLM turned it off (pipeline parallelism, speculative decoding or the executor)"
    if setting == "slot_reuse":
        return "vLLM V1 always reuses batch slots (persistent batch)"
    if setting == "detokenizer_async":
        return "vLLM ignored VLLM_ENABLE_V1_MULTIPROCESSING"
    return f"vLLM runs with {got} instead"


def row(setting: str, asked: dict[str, Any], report: StartupReport) -> Row:
    got = report.value(setting)
    wanted = asked.get(setting)
    if got is None:
        note = "this vLLM did not report it" + ("; passed as asked" if setting in asked else "")
        return Row(setting, wanted, None, NOT_REPORTED, note)
    if setting not in asked:
        return Row(setting, None, got, DEFAULT)
    if _same(setting, wanted, got):
        note = f"auto resolved to {got}" if setting == "dtype" and wanted == "auto" else ""
        return Row(setting, wanted, got, IN_FORCE, note)
    return Row(setting, wanted, got, CANNOT, _why_not(setting, wanted, got, report))


def build_rows(asked: dict[str, Any], report: StartupReport) -> list[Row]:
    return [row(setting, asked, report) for setting in SECTIONS]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _label(setting: str) -> str:
    section = SECTIONS[setting]
    return f"(vLLM) {setting}" if section.startswith("(") else f"[{section}].{setting}"


def render(title: str, rows: list[Row], report: StartupReport) -> str:
    header = ("setting", "config.toml", "vLLM runs with", "status")
    cells = [(_label(r.setting), _cell(r.asked), _cell(r.runs_with), r.status) for r in rows]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(4)]
    lines = [title]
    for line, r in zip([header, *cells], [None, *rows], strict=True):
        text = "  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))
        lines.append((text + (f"  ({r.note})" if r and r.note else "")).rstrip())
    if report.kv_cache_tokens is not None:
        concurrency = f"; maximum concurrency {report.max_concurrency}" if report.max_concurrency else ""
        lines.append(f"  KV cache: {report.kv_cache_tokens:,} tokens{concurrency}")
    if report.hook_error:
        lines.append(f"  (vLLM's resolved configuration could not be read in full: {report.hook_error})")
    return "\n".join(lines)
