"""`zerogap keys ... --url URL`: the gateway's admin API over HTTP, with the admin key from
ZEROGAP_ADMIN_KEY, returning what the local store returns (so one printer serves both)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from gateway.tenants.keys.base import DuplicateKeyName, KeyLimits, KeyRecord, KeyStoreError, UsageRow
from gateway.tenants.keys.fields import KeyFields

ADMIN_KEY_ENV = "ZEROGAP_ADMIN_KEY"
TIMEOUT_S = 10.0


class AdminClient:
    def __init__(self, url: str, admin_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV, "")
        if not key:
            raise KeyStoreError(f"set {ADMIN_KEY_ENV} to the gateway's [server].admin_key to use --url.")
        self._key = key

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        req = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise KeyStoreError(f"cannot reach the gateway at {self.url} ({exc}). Check --url.") from None
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode(errors="replace")[:200]
        if status == 404 and path.startswith("/admin/keys/"):
            return status, None
        if status == 404:
            message = f"{self.url} has no admin API: set [server].admin_key in its config.toml."
        if status == 409:
            raise DuplicateKeyName(message)
        raise KeyStoreError(f"the gateway answered {status}: {message}")

    def create(self, fields: KeyFields) -> str:
        """POST the key's fields (checked here already, and again by the gateway)."""
        given = {"name": fields.name, "models": fields.models, **fields.limits.as_dict(),
                 "expires_in_days": fields.expires_in_days}  # fmt: skip
        body = {k: list(v) if isinstance(v, tuple) else v for k, v in given.items() if v is not None}
        _, answer = self._call("POST", "/admin/keys", body)
        return str(answer["key"])

    def keys(self) -> list[KeyRecord]:
        _, answer = self._call("GET", "/admin/keys")
        return [
            KeyRecord(k["name"], "", tuple(k["models"]) if k["models"] is not None else None,
                      KeyLimits(**{n: k.get(n) for n in KeyLimits.names()}),
                      float(k["created_at"]), k["expires_at"], 0.0 if k["revoked"] else None)
            for k in answer["data"]
        ]  # fmt: skip

    def usage(self) -> list[UsageRow]:
        _, answer = self._call("GET", "/admin/usage")
        return [
            UsageRow(u["key"], u["model"], u["requests"], u["prompt_tokens"], u["completion_tokens"])
            for u in answer["data"]
        ]

    def revoke(self, name: str) -> bool:
        status, _ = self._call("DELETE", f"/admin/keys/{quote(name, safe='')}")
        return status == 200
