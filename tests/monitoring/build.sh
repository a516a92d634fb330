#!/usr/bin/env bash
# Build promtool (Prometheus v3.16, module v0.316.0) from the Go module proxy, and take the
# Prometheus Operator's CRDs (v0.94.0: PodMonitor, PrometheusRule, ...) from its module zip.
# Outputs live outside the repo, keyed by the hash of everything that makes them, and are reused
# while unchanged. Prints the output directory (last line of stdout): bin/promtool, crds/*.yaml.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
operator=github.com/prometheus-operator/prometheus-operator
key=$(cat "$here"/go.{mod,sum} "$here"/tools.go "$0" | sha256sum | cut -c1-16)
cache="${LINGJUN_MONITORING_CACHE:-$HOME/.cache/lingjun-rdma/monitoring}"
out="$cache/$key"

if [ -x "$out/bin/promtool" ] && [ -d "$out/crds" ]; then touch "$out"; echo "$out"; exit 0; fi
find "$cache" -mindepth 1 -maxdepth 1 -type d -mtime +14 -exec rm -rf {} + 2>/dev/null || true
rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin" "$out.tmp/crds"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
t0=$(date +%s)
echo "monitoring: building promtool (cold: ~10 min on 2 cores)" >&2
# remove_all_sd: no service discovery plugins (cloud SDKs); `check rules` and `test rules` use none
(cd "$here" && nice -n 10 go build -trimpath -tags remove_all_sd -ldflags "-s -w" \
  -o "$out.tmp/bin/promtool" github.com/prometheus/prometheus/cmd/promtool) >&2
# `go list -m` prints an empty Dir for a module not yet in the module cache: download it first.
crds=$(cd "$here" && go mod download "$operator" && go list -m -f '{{.Dir}}' "$operator")
if [ ! -d "$crds/example/prometheus-operator-crd" ]; then
  echo "monitoring: $operator has no example/prometheus-operator-crd in the module cache ('$crds')" >&2
  exit 1
fi
cp "$crds"/example/prometheus-operator-crd/monitoring.coreos.com_{podmonitors,prometheusrules}.yaml \
  "$out.tmp/crds/"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "monitoring: built in $(( $(date +%s) - t0 )) s into $out" >&2
echo "$out"
