#!/usr/bin/env bash
# Start a real Prometheus (Debian's package: scripts/setup-system installs it) with zerogap's
# scrape config, recording rules and console dashboards. Extra arguments go to prometheus.
#   deploy/prometheus/run.sh                      # http://127.0.0.1:9090/consoles/index.html
#   PROMETHEUS_PORT=9091 deploy/prometheus/run.sh
# What it scrapes comes from ./config.toml and ./settings.json ($ZEROGAP_CONFIG, $ZEROGAP_SETTINGS):
# the gateway's port, the pool's backends, the load generator's exporter, and DCGM only where an
# NVIDIA GPU is (scrape_targets.py writes them to $PROMETHEUS_GENERATED, default runs/prometheus;
# run it again after config.toml changes: Prometheus re-reads them). Without a config.toml it uses
# deploy/prometheus/prometheus.yml as it is.
# Data goes to $PROMETHEUS_DATA (default: runs/prometheus-data, kept between starts).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
port="${PROMETHEUS_PORT:-9090}"
data="${PROMETHEUS_DATA:-$root/runs/prometheus-data}"
generated="${PROMETHEUS_GENERATED:-$root/runs/prometheus}"
mkdir -p "$data"
command -v prometheus >/dev/null 2>&1 || { echo "prometheus not found: run scripts/setup-system" >&2; exit 1; }
python="$root/.venv/bin/python"
[ -x "$python" ] || python="$(command -v python3 || true)"
config="$here/prometheus.yml"
if [ -n "$python" ] && "$python" "$here/scrape_targets.py" --out "$generated"; then
    config="$generated/prometheus.yml"
else
    echo "run.sh: scraping what $config names (127.0.0.1:8000, 8100, 9400, 9646)" >&2
fi
echo "Prometheus on http://127.0.0.1:$port  dashboards: http://127.0.0.1:$port/consoles/index.html" >&2
exec prometheus \
    --config.file="$config" \
    --web.listen-address="127.0.0.1:$port" \
    --web.console.templates="$here/consoles" \
    --web.console.libraries="$here/console_libraries" \
    --storage.tsdb.path="$data" \
    --storage.tsdb.retention.time=15d \
    "$@"
