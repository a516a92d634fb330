#!/usr/bin/env bash
# Build kubelet, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v1.34.4 and
# containerd, containerd-shim-runc-v2, ctr v2.2.9 (containerd 2 applies CDI devices; Debian's 1.6
# does not) from the Go module proxy, plus the static pause, once per input: outputs live outside
# the repo, keyed by the hash of everything that makes them, and are reused when unchanged.
# Prints the bin directory (last line of stdout).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/k8s"
version=v1.34.4
key=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "$mod/pause/main.go" "$0" \
  | sha256sum | cut -c1-16)
cache="${LINGJUN_E2E_CACHE:-$HOME/.cache/lingjun-rdma/e2e}"
out="$cache/$key"
ctd=github.com/containerd/containerd/v2
ctd_version=$(awk -v m="$ctd" '$1 == m {print $2}' "$mod/go.mod")  # v2.2.9; ACK ships 2.1.x
progs=(kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl pause
  containerd containerd-shim-runc-v2 ctr)

built() { for p in "${progs[@]}"; do [ -x "$out/bin/$p" ] || return 1; done; }
if built; then touch "$out"; echo "$out/bin"; exit 0; fi
# ~400 MB per key: drop the builds no run has used for two weeks
find "$cache" -mindepth 1 -maxdepth 1 -type d -mtime +14 -exec rm -rf {} + 2>/dev/null || true
mkdir -p "$out/bin.tmp"
# The kubelet reports this version in Node.status; an unset one reads v0.0.0-master.
pkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=34 \
  -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
# containerd's own static release build: its tags, and its version in `containerd --version`
ctd_ldflags="-s -w -X $ctd/version.Version=$ctd_version"
ctd_tags="urfave_cli_no_docs osusergo netgo static_build"
t0=$(date +%s)
for p in "${progs[@]}"; do
  [ -x "$out/bin.tmp/$p" ] && continue  # an interrupted build keeps what it finished
  src="k8s.io/kubernetes/cmd/$p" ldflags=$k8s_ldflags tags=""
  case "$p" in
    pause) src=./pause ;;
    containerd | ctr) src="$ctd/cmd/$p" ldflags=$ctd_ldflags tags=$ctd_tags ;;
    containerd-shim-runc-v2) src="$ctd/cmd/$p" ldflags=$ctd_ldflags tags="$ctd_tags no_grpc" ;;
  esac
  echo "e2e: building $p (cold, all nine: 20-40 min on 2 cores)" >&2
  # static (no cgo): the pause binary goes into an image with nothing else in it; readonly:
  # a build never rewrites the committed go.mod/go.sum
  (cd "$mod" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" nice -n 10 \
    go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/bin.tmp/$p.part" "$src" \
    && mv "$out/bin.tmp/$p.part" "$out/bin.tmp/$p") >&2
done
rm -rf "$out/bin" && mv "$out/bin.tmp" "$out/bin"
echo "e2e: built in $(( $(date +%s) - t0 )) s into $out/bin" >&2
echo "$out/bin"
