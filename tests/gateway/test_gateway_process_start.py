"""tests/gateway/processes.py's GatewayProcess: start() with --workers N returns once every worker
listens on the port, not when the first one does (a test that counts on both then races nothing)."""

from __future__ import annotations

from pathlib import Path

import psutil

from common.net import free_port
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.processes import UNIFIED, GatewayProcess, chat, write_config


def listens(pid: int, port: int) -> bool:
    conns = psutil.Process(pid).net_connections("tcp")
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


def test_start_with_two_workers_returns_once_both_listen(tmp_path: Path) -> None:
    with UpstreamServer(model="m") as up:
        port = free_port()
        with GatewayProcess(write_config(tmp_path / "config.toml", port, up.url, {}), port, workers=2) as gw:
            pids = gw.worker_pids()  # read at once: no wait between start() and these checks
            assert len(pids) == 2 and all(listens(pid, port) for pid in pids), (pids, gw.logs())
            assert gw.serving()
            assert [chat(gw.url, UNIFIED)[0] for _ in range(6)] == [200] * 6
