"""What a Grafana stat or tooltip shows for one value of a panel's field, as Grafana's value
mappings decide it (packages/grafana-data valueMappings.ts: the mappings in order, the first that
matches wins; a "value" mapping matches String(value), a "special" one null, NaN or either).
Grafana is not packaged for Debian, so the tests read its mappings this way."""

from __future__ import annotations

import math
from typing import Any

from tests.deploy.paths import grafana_panels

NO_VALUE = "No data"  # Grafana's text for a null value without a mapping
P99_TILES = [5, 6, 37, 38]  # TTFT and TPOT p99, gateway and client: NaN over a minute without requests
STEP = 35  # the Load generator's Step tile


def grafana_panel(panel_id: int) -> dict[str, Any]:
    (found,) = [p for p in grafana_panels() if p["id"] == panel_id]
    return found


def js_string(value: float) -> str:
    """JavaScript's String(value) for a number: "0", "-1", "2.5", "NaN"."""
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value.is_integer() else repr(value)


def _special_matches(match: str, value: float | None) -> bool:
    is_null, is_nan = value is None, value is not None and math.isnan(value)
    return {"null": is_null, "nan": is_nan, "null+nan": is_null or is_nan}.get(match, False)


def shown(panel: dict[str, Any], value: float | None) -> str:
    """The text the panel shows for value (None: null, as the newer reducers make of an all-NaN series)."""
    for mapping in panel["fieldConfig"]["defaults"].get("mappings", []):
        options = mapping["options"]
        if mapping["type"] == "value" and value is not None:
            result = options.get(js_string(value))
            if result is not None:
                return str(result["text"])
        elif mapping["type"] == "special" and _special_matches(options["match"], value):
            return str(options["result"]["text"])
    return NO_VALUE if value is None else js_string(value)
