"""`zerogap keys create|list|revoke`: manage virtual keys in the key store config.toml names
(the SQLite file, or PostgreSQL with [gateway].database_url), or, with --url, through a
running gateway's admin API (admin key from ZEROGAP_ADMIN_KEY)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime

from common.argtypes import positive_float, positive_int
from common.config import ConfigError, load_config
from gateway.tenants.admin_client import AdminClient
from gateway.tenants.keys.auto import open_store
from gateway.tenants.keys.base import KeyLimits, KeyRecord, KeyStoreError, Store, UsageRow
from gateway.tenants.keys.fields import KeyFields, checked


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="zerogap keys", description="Manage the gateway's virtual keys.")
    parser.add_argument("--config", default="config.toml", help="config file whose key store to use")
    parser.add_argument("--url", help="a running gateway (http://host:8000): use its admin API instead of the store")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a key and print its secret once")
    create.add_argument("--name", required=True, help="a unique name (used in logs, metrics and usage)")
    create.add_argument("--models", help="comma-separated models the key may use, e.g. m1,m2 (default: all)")
    for limit in KeyLimits.names():  # --rpm, --tpm, --max-concurrency, ...
        create.add_argument(f"--{limit.replace('_', '-')}", type=positive_int, metavar="N",
                            help=f"{KeyLimits.meaning(limit)} (default: no limit)")  # fmt: skip
    create.add_argument("--expires-in", type=positive_float, metavar="DAYS", help="expire after DAYS days")
    listing = sub.add_parser("list", help="list keys (never their secrets) and their usage")
    revoke = sub.add_parser("revoke", help="revoke a key by name (effective within a second)")
    revoke.add_argument("name")
    for command in (create, listing, revoke):  # --config/--url also after the command: `keys list --config F`
        command.add_argument("--config", default=argparse.SUPPRESS, help="config file (default config.toml)")
        command.add_argument("--url", default=argparse.SUPPRESS, help="a running gateway's URL (admin API)")
    return parser.parse_args(argv)


LIMIT_HEADS = {"max_concurrency": "MAXCONC"}  # a column head shorter than the field's name


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def print_keys(keys: list[KeyRecord], usage_rows: list[UsageRow]) -> None:
    usage: dict[str, tuple[int, int, int]] = {}
    for row in usage_rows:
        n, p, c = usage.get(row.key_name, (0, 0, 0))
        usage[row.key_name] = (n + row.num_requests, p + row.prompt_tokens, c + row.completion_tokens)
    heads = [LIMIT_HEADS.get(name, name.upper()) for name in KeyLimits.names()]
    print(f"{'NAME':<20} {'STATUS':<8} {'MODELS':<20} " + " ".join(f"{h:>8}" for h in heads)
          + f" {'EXPIRES':<21} {'REQUESTS':>8} {'TOKENS':>9}")  # fmt: skip
    now = time.time()
    for k in keys:
        n, p, c = usage.get(k.name, (0, 0, 0))
        models = ",".join(k.models) if k.models else "*"
        limits = " ".join(f"{v or '-':>8}" for v in k.limits.values())
        print(f"{k.name:<20} {k.status(now):<8} {models:<20} {limits} {_when(k.expires_at):<21} {n:>8} {p + c:>9}")


def _created(name: str, secret: str) -> int:
    print(secret)
    print(f"created key {name!r}; the secret above is shown once, store it now.", file=sys.stderr)
    return 0


def _revoked(name: str, ok: bool) -> int:
    if ok:
        print(f"revoked key {name!r}")
        return 0
    print(f"zerogap keys: no active key named {name!r} (see `zerogap keys list`).", file=sys.stderr)
    return 1


def new_key_fields(args: argparse.Namespace) -> KeyFields:
    """The options of `keys create`, checked as the admin API checks a body. --models "a, b" names
    a and b; an empty name ("a,,b", "") is refused, never read as "every model"."""
    models = [m.strip() for m in args.models.split(",")] if args.models is not None else None
    limits = {name: getattr(args, name) for name in KeyLimits.names()}
    return checked(args.name, models, limits, args.expires_in)


async def run_local(store: Store, args: argparse.Namespace) -> int:
    fields = new_key_fields(args) if args.command == "create" else None
    await store.open()
    try:
        if fields is not None:
            days = fields.expires_in_days
            expires = time.time() + days * 86400 if days else None
            secret = await store.create(fields.name, fields.models, fields.limits, expires)
            return _created(fields.name, secret)
        if args.command == "list":
            print_keys(await store.keys(), await store.usage())
            return 0
        return _revoked(args.name, await store.revoke(args.name))
    finally:
        await store.close()


def run_remote(client: AdminClient, args: argparse.Namespace) -> int:
    if args.command == "create":
        return _created(args.name, client.create(new_key_fields(args)))
    if args.command == "list":
        print_keys(client.keys(), client.usage())
        return 0
    return _revoked(args.name, client.revoke(args.name))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        if args.url:
            return run_remote(AdminClient(args.url), args)
        config = load_config(args.config, strict_env=False)
        return asyncio.run(run_local(open_store(config), args))
    except (ConfigError, KeyStoreError) as exc:
        print(f"zerogap keys: {exc}", file=sys.stderr)
        return 2
