"""workload.model absent: ask GET {base_url}/v1/models and use the only model it lists;
with several (or none), stop and list them, so the user picks one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ModelChoiceError(Exception):
    """No model can be chosen; str() says why and what to write in settings.json. kind: the
    failure's kind as the fail-fast advice knows it ("HTTP 401", "connection error"), or ""."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


def list_models(base_url: str, headers: dict[str, str], timeout_s: float) -> list[str]:
    """The ids GET {base_url}/v1/models lists. Raises ModelChoiceError with the reason."""
    url = f"{base_url.rstrip('/')}/v1/models"
    request = urllib.request.Request(url, headers={**headers, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: Any = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ModelChoiceError(f"GET {url} answered HTTP {exc.code}: {_message(exc)}", f"HTTP {exc.code}") from None
    except (OSError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelChoiceError(f"GET {url} failed: {reason}", "connection error") from None
    except ValueError:
        raise ModelChoiceError(f"GET {url} did not answer JSON: is api.base_url an OpenAI-compatible API?") from None
    try:
        return [str(item["id"]) for item in body["data"]]
    except (KeyError, TypeError):
        raise ModelChoiceError(f"GET {url} did not answer an OpenAI model list ({{'data': [{{'id': ...}}]}})") from None


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read()[:500].decode("utf-8", "replace")
    except OSError:
        return exc.reason
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip() or str(exc.reason)


def choose_model(base_url: str, headers: dict[str, str], timeout_s: float) -> str:
    models = list_models(base_url, headers, timeout_s)
    if len(models) == 1:
        return models[0]
    if not models:
        raise ModelChoiceError(f"{base_url}/v1/models lists no model: is a backend up behind it?")
    listed = ", ".join(models)
    raise ModelChoiceError(
        f"settings.json names no workload.model and {base_url}/v1/models lists {len(models)}: {listed}. "
        f'Pick one: "workload": {{"model": "{models[0]}"}}'
    )
