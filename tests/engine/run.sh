#!/usr/bin/env bash
# `make engine`: the real Pulumi engine (CLI + pulumi-resource-kubernetes, built from the Go
# module proxy) deploys the `local` stack onto the e2e harness's real cluster. The pytest session
# owns every process it starts and tears all of it down.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
LINGJUN_E2E_BIN=$(tests/e2e/peers.sh | tail -n1)
LINGJUN_ENGINE_BIN=$(tests/engine/build.sh | tail -n1)
LINGJUN_MONITORING=$(tests/monitoring/build.sh | tail -n1)  # the Prometheus Operator's CRDs
export LINGJUN_E2E_BIN LINGJUN_ENGINE_BIN LINGJUN_MONITORING
export LINGJUN_E2E_LOGS=out/engine-logs
t1=$(date +%s)
echo "engine: peers ready in $(( t1 - t0 )) s; binaries from $LINGJUN_E2E_BIN and $LINGJUN_ENGINE_BIN"
rc=0
.venv/bin/python -m pytest -m engine tests/engine "$@" || rc=$?
[ "$rc" -ne 5 ] || echo "engine: pytest ran no test: that is a failure here" >&2
echo "engine: scenarios ran in $(( $(date +%s) - t1 )) s (total $(( $(date +%s) - t0 )) s); logs in $LINGJUN_E2E_LOGS"
exit "$rc"
