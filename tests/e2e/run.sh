#!/usr/bin/env bash
# `make e2e`: install the Debian peers, build (or reuse) the Kubernetes programs, run the e2e
# scenarios. The pytest session owns every process it starts and tears all of it down.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
LINGJUN_E2E_BIN=$(tests/e2e/peers.sh | tail -n1)
export LINGJUN_E2E_BIN
t1=$(date +%s)
echo "e2e: peers ready in $(( t1 - t0 )) s; binaries from $LINGJUN_E2E_BIN"
rc=0
.venv/bin/python -m pytest -m e2e tests/e2e "$@" || rc=$?
[ "$rc" -ne 5 ] || echo "e2e: pytest ran no test: that is a failure here" >&2
echo "e2e: scenarios ran in $(( $(date +%s) - t1 )) s (total $(( $(date +%s) - t0 )) s); logs in out/e2e-logs"
exit "$rc"
