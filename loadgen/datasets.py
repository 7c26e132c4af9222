"""Datasets from files (settings.json `workload.dataset`), read and checked before a request is sent.

- JSONL of OpenAI request bodies, one per line: chat (`messages`) or completions (`prompt`), with
  `max_tokens` (or `max_completion_tokens`) when the line sets it; every other field is passed
  through. The file picks the endpoint: all its lines are chat bodies, or all completions.
- ShareGPT JSON: a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}.
  Each human turn and the reply after it make a turn; the reply's length in the engine's tokens
  becomes that turn's `max_tokens` (counted when the run starts: loadgen/dataset_source.py).
  Conversations with no human turn followed by a reply are skipped (counted in `skipped`).

A file that cannot be used raises DataFileError naming the file, the line and what to fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing", "model"})
SYSTEM_ROLES = frozenset({"system"})
EXAMPLE_CHAT = '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}'


class DataFileError(Exception):
    """A dataset or trace file that cannot be used; str() names the file, the line and the fix."""


@dataclass
class Turn:
    """One request: the body's own fields as written (prompt or messages, max_tokens...), and for a
    ShareGPT turn the reply whose token count becomes max_tokens."""

    body: dict[str, Any]
    reply: str | None = None


@dataclass
class DatasetItem:
    line: int  # where it starts in the file (1-based)
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Dataset:
    path: str
    format: str  # "openai_jsonl" or "sharegpt"
    chat: bool  # the endpoint: /v1/chat/completions (True) or /v1/completions
    items: list[DatasetItem]
    skipped: int = 0  # ShareGPT conversations with no usable turn


def read_dataset(path: str | Path, chat_endpoint: bool, turns: str = "first") -> Dataset:
    """The file's items. chat_endpoint: how ShareGPT turns are sent (a JSONL's lines say it themselves)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataFileError(f"{file}: cannot read it ({exc.strerror or exc}). Check workload.dataset.") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{file}: not UTF-8 text (byte {exc.start}). Save it as UTF-8.") from None
    stripped = text.lstrip()
    if file.suffix == ".jsonl" or (file.suffix != ".json" and not stripped.startswith("[")):
        return _read_jsonl(file, text)
    return _read_sharegpt(file, text, chat_endpoint, turns)


def _read_jsonl(file: Path, text: str) -> Dataset:
    items: list[DatasetItem] = []
    chat_line: tuple[bool, int] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno}). Each line is one request body, "
                f"e.g. {EXAMPLE_CHAT}"
            ) from None
        chat = _check_body(body, where)
        if chat_line is None:
            chat_line = (chat, number)
        elif chat != chat_line[0]:
            kinds = ("chat (messages)", "completions (prompt)")
            raise DataFileError(
                f"{where}: a {kinds[not chat]} body, but line {chat_line[1]} is a {kinds[chat]} body; "
                "one file is sent to one endpoint: split it in two"
            )
        items.append(DatasetItem(number, [Turn(body)]))
    if chat_line is None:
        raise DataFileError(f"{file}: no request body in it. Write one JSON body per line, e.g. {EXAMPLE_CHAT}")
    return Dataset(str(file), "openai_jsonl", chat_line[0], items)


def _check_body(body: Any, where: str) -> bool:
    """True for a chat body, False for a completions body; DataFileError for anything else."""
    if not isinstance(body, dict):
        raise DataFileError(f"{where}: a line must be a JSON object (a request body), not {type(body).__name__}")
    has_messages, has_prompt = "messages" in body, "prompt" in body
    if has_messages == has_prompt:
        which = "both" if has_messages else "neither"
        raise DataFileError(f"{where}: the body has {which} of messages and prompt; give one (chat or completions)")
    if has_messages:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataFileError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise DataFileError(f"{where}: messages[{index}] must be an object with a role and a content")
    else:
        prompt = body["prompt"]
        if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
            raise DataFileError(f"{where}: prompt must be a non-empty string (or a list of prompts)")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise DataFileError(f"{where}: {name} must be a whole number >= 1 (got {json.dumps(value)})")
    return has_messages


def _entries(file: Path, text: str) -> list[tuple[int, Any]]:
    """The top-level list's entries with the line each starts on."""
    decoder = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        return pos

    pos = skip(0)
    if not text.startswith("[", pos):
        shape = '[{"conversations": [...]}, ...]'
        raise DataFileError(f"{file}:{line_of(pos)}: a ShareGPT file is a JSON list {shape}")
    entries: list[tuple[int, Any]] = []
    pos = skip(pos + 1)
    while True:
        if text.startswith("]", pos):
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{file}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        entries.append((line_of(pos), value))
        pos = skip(end)
        if text.startswith(",", pos):
            pos = skip(pos + 1)
        elif not text.startswith("]", pos):
            raise DataFileError(f"{file}:{line_of(pos)}: expected , or ] after entry {len(entries) - 1}")
    if skip(pos + 1) != len(text):
        raise DataFileError(f"{file}:{line_of(skip(pos + 1))}: text after the list's closing ]")
    return entries


def _read_sharegpt(file: Path, text: str, chat: bool, turns: str) -> Dataset:
    items: list[DatasetItem] = []
    skipped = 0
    for index, (line, entry) in enumerate(_entries(file, text)):
        where = f"{file}:{line} (entry {index})"
        conversation = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conversation, list):
            raise DataFileError(f'{where}: each entry needs "conversations": a list of {{"from", "value"}} turns')
        messages: list[dict[str, str]] = []
        for number, turn in enumerate(conversation):
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise DataFileError(f'{where}: conversations[{number}] needs "from" and a text "value"')
            messages.append({"role": _role(turn.get("from"), f"{where}: conversations[{number}]"),
                             "content": turn["value"]})  # fmt: skip
        item = DatasetItem(line, _turns(messages, chat, turns == "first"))
        if item.turns:
            items.append(item)
        else:
            skipped += 1
    if not items:
        raise DataFileError(f"{file}: no conversation has a human turn followed by a reply ({skipped} skipped)")
    return Dataset(str(file), "sharegpt", chat, items, skipped)


def _role(name: Any, where: str) -> str:
    if name in USER_ROLES:
        return "user"
    if name in ASSISTANT_ROLES:
        return "assistant"
    if name in SYSTEM_ROLES:
        return "system"
    raise DataFileError(f'{where}: "from" is {json.dumps(name)}; use "human", "gpt" or "system"')


def _turns(messages: list[dict[str, str]], chat: bool, first_only: bool) -> list[Turn]:
    """A request for each user message answered by the next one: the conversation up to it, and the reply.
    A conversation stops at the first two user (or two assistant) messages in a row."""
    out: list[Turn] = []
    history: list[dict[str, str]] = []
    position = 0
    while position < len(messages) and messages[position]["role"] == "system":
        history.append(messages[position])
        position += 1
    while position + 1 < len(messages):
        question, reply = messages[position], messages[position + 1]
        if question["role"] != "user" or reply["role"] != "assistant" or not question["content"]:
            break
        history.append(question)
        body: dict[str, Any] = {"messages": list(history)}
        if not chat:
            body = {"prompt": "\n\n".join(m["content"] for m in history)}
        out.append(Turn(body, reply["content"]))
        if first_only:
            break
        history.append(reply)
        position += 2
    return out
