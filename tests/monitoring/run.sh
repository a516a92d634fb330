#!/usr/bin/env bash
# `make monitoring`: the alert pack and dashboard under the real promtool, and the monitoring
# objects under the Prometheus Operator's CRDs (both from the Go module proxy, built and cached
# by build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
LINGJUN_MONITORING=$(tests/monitoring/build.sh | tail -n1)
export LINGJUN_MONITORING
rc=0
.venv/bin/python -m pytest -m monitoring tests/monitoring "$@" || rc=$?
[ "$rc" -ne 5 ] || echo "monitoring: pytest ran no test: that is a failure here" >&2
exit "$rc"
