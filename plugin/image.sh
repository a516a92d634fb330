#!/usr/bin/env bash
# Build $DOCKERFILE (plugin/Dockerfile, or a sample's: `make sample-image`) as $IMAGE (`make
# image`). With a running Docker or Podman engine, that
# engine builds it. Without one, buildah does, daemonless (chroot isolation, overlay storage under
# $IMAGE_CACHE, layers cached), on a Debian bookworm base made by mmdebstrap: no registry needs
# to serve debian:bookworm-slim. IMAGE_ARCHIVE=path also writes the image as a docker-archive
# tar (what `ctr images import` and `docker load` take).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-lingjun-rdma-plugin:dev}
DOCKERFILE=${DOCKERFILE:-plugin/Dockerfile}
IMAGE_CACHE=${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lingjun-rdma/containers}
# Made again each month, and with it every cached layer above it: Debian's updates get in.
BASE=localhost/lingjun-rdma-base:bookworm-$(date +%Y%m)
log() { echo "image.sh: $*" >&2; }

for engine in docker podman; do
  if command -v "$engine" >/dev/null && "$engine" info >/dev/null 2>&1; then
    "$engine" build -f "$DOCKERFILE" -t "$IMAGE" .
    if [ -n "${IMAGE_ARCHIVE:-}" ]; then "$engine" save -o "$IMAGE_ARCHIVE" "$IMAGE"; fi
    exit 0
  fi
done

need=()
for tool in buildah:buildah mmdebstrap:mmdebstrap; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if ((${#need[@]})); then
  log "no container engine runs here; apt: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# overlay, not vfs: vfs stores every layer as a whole copy of the image (~250 MB a step)
buildah=(buildah --root "$IMAGE_CACHE/overlay" --runroot "$IMAGE_CACHE/run" --storage-driver overlay)

if ! "${buildah[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  log "making $BASE with mmdebstrap"
  mkdir -p "$IMAGE_CACHE"
  tar=$IMAGE_CACHE/base.tar
  mirror=http://deb.debian.org
  # minbase, like debian:bookworm-slim: no docs, man pages or locales
  # shellcheck disable=SC2016 # "$1" in a hook is the rootfs, expanded by mmdebstrap's shell
  mmdebstrap --variant=minbase --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' bookworm "$tar" \
    "deb $mirror/debian bookworm main" "deb $mirror/debian bookworm-updates main" \
    "deb $mirror/debian-security bookworm-security main" >&2
  ctr=$("${buildah[@]}" from scratch)
  "${buildah[@]}" add "$ctr" "$tar" / >/dev/null
  "${buildah[@]}" config --cmd '["bash"]' "$ctr"
  "${buildah[@]}" commit -q --rm "$ctr" "$BASE" >/dev/null
  rm -f "$tar"
fi

# Behind a TLS-intercepting proxy, pip in the build needs this host's CA bundle: mounted for the
# RUN steps only (never copied into the image) and named by the Dockerfile's PIP_CERT argument.
ca=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  ca=(-v /etc/ssl/certs/ca-certificates.crt:/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt)
fi
"${buildah[@]}" bud --isolation chroot --layers --pull-never --build-arg "BASE=$BASE" "${ca[@]}" \
  -f "$DOCKERFILE" -t "$IMAGE" . >&2
if [ -n "${IMAGE_ARCHIVE:-}" ]; then
  rm -f "$IMAGE_ARCHIVE"
  "${buildah[@]}" push -q "$IMAGE" "docker-archive:$IMAGE_ARCHIVE:$IMAGE"
fi
log "built $IMAGE ($("${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$IMAGE" | cut -c1-12))"
