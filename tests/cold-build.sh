#!/usr/bin/env bash
# Every build the tests need, from empty caches, as a new machine or CI on one runs them: the Go
# module and build caches, uv's cache, and each build's own output cache all point into one new
# directory (COLD_ROOT, default a fresh mktemp -d, removed afterwards unless COLD_KEEP=1).
# `make cold-build` runs it; run it before calling a change to any build script done. A warm
# machine hides a missing download or install step; this does not. Debian packages that the host
# already has stay installed (apt is the machine's, not a cache of ours): a fresh machine has none
# of the peers' packages, and each build installs what it lacks.
# Prints each build's wall time; exits non-zero at the first build that fails.
# `tests/cold-build.sh ci` instead runs the whole `.ci/run` on a clone of HEAD in that same empty
# environment and prints its wall time: what CI on a new machine costs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${COLD_ROOT:-$(mktemp -d /tmp/lingjun-cold.XXXXXX)}
[ "${COLD_KEEP:-0}" = 1 ] || trap 'chmod -R u+w "$root" 2>/dev/null; rm -rf "$root"' EXIT
mkdir -p "$root"
export GOMODCACHE=$root/gomod GOCACHE=$root/gobuild UV_CACHE_DIR=$root/uv \
  XDG_CACHE_HOME=$root/xdg LINGJUN_ENGINE_CACHE=$root/engine LINGJUN_E2E_CACHE=$root/e2e \
  LINGJUN_MONITORING_CACHE=$root/monitoring RDMA_VM_CACHE=$root/vm IMAGE_CACHE=$root/containers
t_all=$(date +%s)
if [ "${1:-}" = ci ]; then
  git clone -q . "$root/clone"
  "$root/clone/.ci/run" 2>&1 | tee "$root/ci.log"
  echo "cold-build: the whole .ci/run passed from empty caches in $(($(date +%s) - t_all)) s" >&2
  exit 0
fi
step() {
  local name=$1 t0 && shift
  t0=$(date +%s)
  echo "cold-build: $name ..." >&2
  "$@" >"$root/$name.log" 2>&1 || {
    echo "cold-build: $name FAILED after $(($(date +%s) - t0)) s; its output:" >&2
    tail -n 40 "$root/$name.log" >&2
    exit 1
  }
  echo "cold-build: $name ok in $(($(date +%s) - t0)) s" >&2
}
step venv bash -c 'd=$(mktemp -d) && git ls-files -z | xargs -0 cp --parents -t "$d" \
  && make -C "$d" setup && rm -rf "$d"'
step vm-bookworm tests/plugin/rdma/vm/build.sh
step vm-forky env RDMA_VM_KERNEL=forky tests/plugin/rdma/vm/build.sh
step plugin-image env IMAGE=lingjun-rdma-plugin:cold plugin/image.sh
step k8s tests/e2e/peers.sh
step engine tests/engine/build.sh
step monitoring tests/monitoring/build.sh
echo "cold-build: all builds passed from empty caches in $(($(date +%s) - t_all)) s" >&2
