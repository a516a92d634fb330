#!/usr/bin/env bash
# The real cluster's peers, for `make e2e` and `make engine`: the Debian packages (their services
# are not started: a run starts private instances) and the Kubernetes programs and containerd 2
# built from the Go module proxy (build_k8s.sh, cached). Prints the bin directory of the built
# ones (last line).
set -euo pipefail
cd "$(dirname "$0")"
packages=(runc etcd-server busybox-static containernetworking-plugins)
missing=$(for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null \
  | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "peers: apt: installing" $missing >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
./build_k8s.sh | tail -n1
