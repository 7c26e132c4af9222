"""Process groups: each supervised child (a backend replica, a gateway worker) leads its own, so
stopping it stops what it started too (vLLM's engine core and workers); and each gets SIGTERM from
the kernel if its supervisor dies."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


# Looked up here, not in the forked child: no dlopen between fork and exec.
_PRCTL = _load_prctl()


def _set_parent_death_signal() -> None:
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def new_group_preexec() -> Callable[[], None] | None:
    """preexec_fn for Popen(start_new_session=True): the parent-death signal, where Linux has it.
    It applies to the direct child: vLLM, on SIGTERM, stops its own engine core."""
    return _set_parent_death_signal if _PRCTL is not None else None


def popen_in_group(argv: list[str], env: dict[str, str], *, capture_output: bool = False) -> subprocess.Popen[bytes]:
    """argv as the leader of a new session and process group: a Ctrl-C in the terminal reaches only the
    supervisor (which forwards it), and the group is stopped as a whole. capture_output: stdout and
    stderr into one pipe (proc.stdout), stdin from /dev/null; otherwise it shares the supervisor's."""
    if capture_output:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=new_group_preexec(),
        )
    return subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=new_group_preexec())


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout_s; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
