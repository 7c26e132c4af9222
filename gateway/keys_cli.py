"""`zerogap keys create|list|revoke`: manage virtual keys in [gateway].key_store."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from gateway.keystore import KeyStore, KeyStoreError
from zerogap.argtypes import positive_float, positive_int
from zerogap.config import ConfigError, load_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="zerogap keys", description="Manage the gateway's virtual keys.")
    parser.add_argument("--config", default="config.toml", help="config file whose [gateway].key_store to use")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a key and print its secret once")
    create.add_argument("--name", required=True, help="a unique name (used in logs, metrics and usage)")
    create.add_argument("--models", help="comma-separated models the key may use (default: all)")
    create.add_argument("--rpm", type=positive_int, help="requests per minute (default: no limit)")
    create.add_argument("--tpm", type=positive_int, help="prompt + completion tokens per minute (default: no limit)")
    create.add_argument("--expires-in", type=positive_float, metavar="DAYS", help="expire after DAYS days")
    listing = sub.add_parser("list", help="list keys (never their secrets) and their usage")
    revoke = sub.add_parser("revoke", help="revoke a key by name (effective within a second)")
    revoke.add_argument("name")
    for command in (create, listing, revoke):  # --config also after the command: `keys list --config F`
        command.add_argument("--config", default=argparse.SUPPRESS, help="config file (default config.toml)")
    return parser.parse_args(argv)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _create(store: KeyStore, args: argparse.Namespace) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    expires = time.time() + args.expires_in * 86400 if args.expires_in else None
    secret = store.create(args.name, models, args.rpm, args.tpm, expires)
    print(secret)
    print(f"created key {args.name!r}; the secret above is shown once, store it now.", file=sys.stderr)
    return 0


def _list(store: KeyStore) -> int:
    usage: dict[str, tuple[int, int, int]] = {}
    for row in store.usage():
        n, p, c = usage.get(row.key_name, (0, 0, 0))
        usage[row.key_name] = (n + row.num_requests, p + row.prompt_tokens, c + row.completion_tokens)
    print(
        f"{'NAME':<20} {'STATUS':<8} {'MODELS':<20} {'RPM':>6} {'TPM':>8} {'EXPIRES':<21} {'REQUESTS':>8} {'TOKENS':>9}"
    )
    now = time.time()
    for k in store.keys():
        n, p, c = usage.get(k.name, (0, 0, 0))
        models = ",".join(k.models) if k.models else "*"
        print(
            f"{k.name:<20} {k.status(now):<8} {models:<20} {k.rpm or '-':>6} {k.tpm or '-':>8} "
            f"{_when(k.expires_at):<21} {n:>8} {p + c:>9}"
        )
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, strict_env=False)
        store = KeyStore(config.resolve_path(config.gateway.key_store))
    except (ConfigError, KeyStoreError) as exc:
        print(f"zerogap keys: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "create":
            return _create(store, args)
        if args.command == "list":
            return _list(store)
        if store.revoke(args.name):
            print(f"revoked key {args.name!r}")
            return 0
        print(f"zerogap keys: no active key named {args.name!r} (see `zerogap keys list`).", file=sys.stderr)
        return 1
    except KeyStoreError as exc:
        print(f"zerogap keys: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
