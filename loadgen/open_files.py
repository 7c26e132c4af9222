"""Raise the open-files limit: each user holds a socket, and Locust's default
environment often allows only 1,024."""

from __future__ import annotations

import logging

log = logging.getLogger("zerogap.loadtest")


def raise_open_files(needed: int) -> int:
    """Raise the soft limit to the hard one; warn when that is still below `needed`."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("zerogap: raised the open-files limit from %s to %s", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("zerogap: cannot raise the open-files limit from %s to %s (%s)", soft, target, exc)
    if soft < needed:
        log.warning(
            "zerogap: the open-files limit is %s but this run may need %s; raise it (ulimit -n %s) "
            "or the users past it will fail to connect",
            soft,
            needed,
            needed,
        )
    return int(soft)
