#!/usr/bin/env bash
# Build the real Pulumi engine from the Go module proxy: the `pulumi` CLI v3.277.0 and
# pulumi-resource-kubernetes v4.25.0 (the one version of provider/v4 the proxy serves; the Python
# SDK is pinned to the same release in pyproject.toml). Outputs live outside the repo, keyed by the
# hash of everything that makes them, and are reused while unchanged. Prints the bin directory
# (last line of stdout).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cli_version=v3.277.0
k8s_version=4.25.0
key=$(cat "$here"/go/cli/go.{mod,sum} "$here"/go/cli/tools.go \
  "$here"/go/provider/go.{mod,sum} "$here"/go/provider/tools.go "$0" | sha256sum | cut -c1-16)
cache="${LINGJUN_ENGINE_CACHE:-$HOME/.cache/lingjun-rdma/engine}"
out="$cache/$key"
progs=(pulumi pulumi-resource-kubernetes)

built() { for p in "${progs[@]}"; do [ -x "$out/bin/$p" ] || return 1; done; }
if built; then touch "$out"; echo "$out/bin"; exit 0; fi
find "$cache" -mindepth 1 -maxdepth 1 -type d -mtime +14 -exec rm -rf {} + 2>/dev/null || true
mkdir -p "$out/bin.tmp"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
t0=$(date +%s)

if [ ! -x "$out/bin.tmp/pulumi" ]; then
  echo "engine: building pulumi $cli_version (cold: ~20 min on 2 cores)" >&2
  (cd "$here/go/cli" && nice -n 10 go build -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$cli_version" \
    -o "$out/bin.tmp/pulumi.part" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
    && mv "$out/bin.tmp/pulumi.part" "$out/bin.tmp/pulumi") >&2
fi

if [ ! -x "$out/bin.tmp/pulumi-resource-kubernetes" ]; then
  echo "engine: building pulumi-resource-kubernetes $k8s_version (cold: ~25 min on 2 cores)" >&2
  # The provider's main package embeds schema-embed.json, which its generate.go makes from the
  # committed schema.json and which the module zip lacks: build a generated copy of that package
  # inside the wrapper module (in the cache, never in the repo).
  src="$out/src"
  rm -rf "$src" && mkdir -p "$src/cmd"
  cp "$here"/go/provider/go.{mod,sum} "$here"/go/provider/tools.go "$src/"
  # `go list -m` prints an empty Dir for a module not yet in the module cache: download it first.
  provider=github.com/pulumi/pulumi-kubernetes/provider/v4
  mod=$(cd "$src" && go mod download "$provider" && go list -m -f '{{.Dir}}' "$provider")
  if [ ! -d "$mod/cmd/pulumi-resource-kubernetes" ]; then
    echo "engine: $provider has no cmd/pulumi-resource-kubernetes in the module cache ('$mod')" >&2
    exit 1
  fi
  cp -r "$mod/cmd/pulumi-resource-kubernetes" "$src/cmd/" && chmod -R u+w "$src/cmd"
  (cd "$src/cmd/pulumi-resource-kubernetes" && VERSION=$k8s_version go run generate.go \
    && nice -n 10 go build -trimpath -ldflags "-s -w \
      -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$k8s_version" \
      -o "$out/bin.tmp/pulumi-resource-kubernetes.part" . \
    && mv "$out/bin.tmp/pulumi-resource-kubernetes.part" "$out/bin.tmp/pulumi-resource-kubernetes") >&2
  rm -rf "$src"
fi

rm -rf "$out/bin" && mv "$out/bin.tmp" "$out/bin"
echo "engine: built in $(( $(date +%s) - t0 )) s into $out/bin" >&2
echo "$out/bin"
