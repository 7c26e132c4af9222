"""Fail fast, with the article's own advice: when the first FIRST_N requests of a run all
fail the same way, more load only repeats the mistake. The run stops (its report is
still written) and the user reads the status, the server's message and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadreport.record import INTERRUPTED, RequestRecord

FIRST_N = 20
# The gateway's failed-auth throttle answers a key refused too often from one address with 429
# (code too_many_auth_failures; its message says this). Its default limit is 20 per 10 s, as many
# as FIRST_N: a run whose key is wrong met 429s among its first 20 answers (its /tokenize call
# counts too), so they never "all failed alike". The mistake is the key: it counts as a 401.
AUTH_THROTTLED = "failed authentications"


def key_refused(kind: str, detail: str) -> bool:
    """A 401, or the gateway's 429 for too many of them (the key is wrong either way)."""
    return kind == "HTTP 401" or (kind == "HTTP 429" and AUTH_THROTTLED in detail)


def doubled_v1(base_url: str, path: str = "/v1/chat/completions", source: str = "api.base_url") -> str | None:
    """The fix when the base URL already ends in /v1: the client appends /v1/... itself, so every
    request would go to .../v1/v1/... and answer 404. None when the URL does not end in /v1."""
    url = base_url.rstrip("/")
    if not url.endswith("/v1"):
        return None
    fixed = url.removesuffix("/v1")
    return (
        f"{source} {url} ends in /v1, but the harness appends {path} itself (requests would go to "
        f"{url}{path}). Set {source} to {fixed}"
    )


def advice(kind: str, base_url: str, model: str, models: list[str] | None) -> str:
    """What to check for this kind of failure (the article's troubleshooting advice)."""
    doubled = doubled_v1(base_url)
    if doubled is not None and kind == "HTTP 404":
        return f"{doubled}."
    if kind == "HTTP 401":
        return (
            "the key was refused. Check that the variable api.api_key_env names holds it "
            "(`echo $TAOTOKEN_API_KEY`) and that it is sent as `Authorization: Bearer <key>` "
            "(with the space after Bearer, no quotes)."
        )
    if kind == "HTTP 404":
        offered = ", ".join(models) if models else "(none could be listed)"
        return (
            f"the model {model!r} or the path was not found. Check workload.model and that api.base_url ends "
            f"at /api (clients call {{base_url}}/v1/chat/completions); {base_url}/v1/models offers: {offered}."
        )
    if kind == "connection error":
        return f"nothing answered at {base_url}. Check api.base_url (scheme, host, port) and that the server is up."
    if kind == "HTTP 429":
        return "the server rate-limits this key: lower load_test.concurrency or raise the key's limits."
    if kind.startswith("HTTP 5"):
        return "the server failed every request: read its log; check that its backends are up (GET /ready)."
    return "read the server's message above."


@dataclass
class FailFast:
    """Watches the first FIRST_N finished requests of a run."""

    first: list[tuple[str, str]] = field(default_factory=list)  # (error kind, detail); kind "" = ok
    decided: bool = False

    def observe(self, record: RequestRecord, detail: str) -> tuple[str, str] | None:
        """(kind, the server's message) once the first FIRST_N all failed alike; else None."""
        if self.decided or record.error_kind == INTERRUPTED:
            return None
        kind = "HTTP 401" if key_refused(record.error_kind, detail) else record.error_kind
        self.first.append((kind, detail.removeprefix(f"{record.error_kind}: ")))
        if len(self.first) < FIRST_N:
            return None
        self.decided = True
        kinds = {kind for kind, _ in self.first}
        if len(kinds) != 1 or "" in kinds:
            return None
        return self.first[-1]
