"""The harness's own command-line options, and the Locust options it reads or sets.

    --settings PATH          the load-test settings (default: $ZEROGAP_SETTINGS, else ./settings.json)
    --progress-seconds S     a progress line every S seconds while a step runs (0: only each step's final line)

Locust prints its request table every 2 s in a headless run (its stats_printer greenlet,
unless --only-summary); the harness's progress lines replace it, so a headless run turns
that table off unless Locust's own --print-stats (or LOCUST_PRINT_STATS) asks for it.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from typing import Any

from loadgen.progress import PROGRESS_S


def add_options(parser: Any) -> None:
    """Locust's init_command_line_parser: the harness's options beside Locust's."""
    parser.add_argument(
        "--settings",
        type=str,
        default=None,
        help="zerogap: the load-test settings file (default: $ZEROGAP_SETTINGS, else ./settings.json)",
    )
    parser.add_argument(
        "--progress-seconds",
        type=float,
        default=PROGRESS_S,
        env_var="ZEROGAP_PROGRESS_SECONDS",
        include_in_web_ui=False,
        help=f"zerogap: a progress line every this many seconds while a step runs; 0: only each step's "
        f"final line (default {PROGRESS_S:g})",
    )


def progress_seconds(options: Namespace | None) -> float:
    value = getattr(options, "progress_seconds", PROGRESS_S) if options is not None else PROGRESS_S
    return max(0.0, float(value if value is not None else PROGRESS_S))


def quiet_locust_table(options: Namespace | None) -> None:
    """Headless: Locust's periodic request table off (as --only-summary), unless --print-stats asks for it.
    Locust reads only_summary after its init event, so setting it there is in time."""
    if options is not None and getattr(options, "headless", False) and not getattr(options, "print_stats", False):
        options.only_summary = True


SPAWN_RATE_WARNING = "Your selected spawn rate is very high"  # Locust's, above 100 users/s (or per worker)


def _not_spawn_rate_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(SPAWN_RATE_WARNING)


def quiet_spawn_rate_warning() -> None:
    """Locust warns of a spawn rate above 100 on every step that adds more than 100 users; the harness
    asks for them all at once on purpose and starts them one by one itself (loadgen/spawn_pacer.py)."""
    logger = logging.getLogger("locust.runners")
    if _not_spawn_rate_warning not in logger.filters:
        logger.addFilter(_not_spawn_rate_warning)
