#!/usr/bin/env bash
# Start a real Prometheus (Debian's package: scripts/setup-system installs it) with zerogap's
# scrape config, recording rules and console dashboards. Extra arguments go to prometheus.
#   deploy/prometheus/run.sh                      # http://127.0.0.1:9090/consoles/index.html
#   PROMETHEUS_PORT=9091 deploy/prometheus/run.sh
# Data goes to $PROMETHEUS_DATA (default: runs/prometheus-data, kept between starts).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
port="${PROMETHEUS_PORT:-9090}"
data="${PROMETHEUS_DATA:-$root/runs/prometheus-data}"
mkdir -p "$data"
command -v prometheus >/dev/null 2>&1 || { echo "prometheus not found: run scripts/setup-system" >&2; exit 1; }
echo "Prometheus on http://127.0.0.1:$port  dashboards: http://127.0.0.1:$port/consoles/index.html" >&2
exec prometheus \
    --config.file="$here/prometheus.yml" \
    --web.listen-address="127.0.0.1:$port" \
    --web.console.templates="$here/consoles" \
    --web.console.libraries="$here/console_libraries" \
    --storage.tsdb.path="$data" \
    --storage.tsdb.retention.time=15d \
    "$@"
