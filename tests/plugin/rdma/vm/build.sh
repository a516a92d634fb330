#!/usr/bin/env bash
# Build (once) the Soft-RoCE test VM: a Debian kernel and a bookworm rootfs packed as an
# initramfs, plus the project's locked Python dependencies for the guest.
# Cached outside the repo under $RDMA_VM_CACHE/<suite>-<hash of inputs>/ (older images of the
# suite are removed once a new one is built); prints that directory.
# Inputs of the hash: this script, the kernel package apt resolves, the locked requirements.
# RDMA_VM_KERNEL=<Debian suite> picks the kernel: bookworm (6.1, the default: nearest to the
# 5.10 of Lingjun nodes) or a newer suite such as forky (7.x: rxe with network namespaces).
set -euo pipefail
cd "$(dirname "$0")/../../../.."

CACHE=${RDMA_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lingjun-rdma/vm}
MIRROR=http://deb.debian.org/debian
# The guest's userspace: Debian's rdma-core 44 and its pyverbs (REFERENCE §3), the tools the
# tests and a human debugging the guest need. No python3-grpcio/protobuf: the locked wheels go in.
PACKAGES=python3,python3-pyverbs,rdma-core,ibverbs-providers,ibverbs-utils,rdmacm-utils,perftest,iproute2,kmod,util-linux,procps
# What the guest loads, in this order: rxe needs a crc32 implementation it does not pull in
# itself (crc32_generic, a module up to 6.x, REFERENCE §5; built in from 7.x, so optional);
# ipvlan/macvlan for the netns tests. For the VM node (tests/e2e/vm_node.py): its NIC (virtio),
# containerd's overlayfs snapshotter, the CNI bridge: modules on 6.1, some built in on 7.x.
OPTIONAL_MODULES="crc32_generic virtio_pci virtio_net overlay bridge"
MODULES="veth rdma_rxe ib_uverbs rdma_ucm ib_umad ipvlan macvlan"
SUITE=${RDMA_VM_KERNEL:-bookworm}
if ! [[ $SUITE =~ ^[a-z]+(-[a-z]+)*$ ]]; then
  echo "build.sh: RDMA_VM_KERNEL=$SUITE: give a Debian suite name, e.g. bookworm or forky" >&2
  exit 2
fi

log() { echo "build.sh: $*" >&2; }

need=()
for tool in qemu-system-x86_64:qemu-system-x86 mmdebstrap:mmdebstrap cpio:cpio depmod:kmod; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if ((${#need[@]})); then
  log "apt: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The suite's kernel through an apt of its own (lists cached, refreshed daily), so that any
# suite works on this bookworm host without touching its sources; signatures checked as usual.
aptdir=$CACHE/apt-$SUITE
mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" >"$aptdir/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache::Archives=$aptdir/archives"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Architecture=amd64
  -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false)
if [ -z "$(find "$aptdir/updated" -mmin -1440 2>/dev/null)" ]; then
  log "apt: updating the $SUITE lists"
  if apt-get "${apt_opts[@]}" update -qq; then
    touch "$aptdir/updated"
  elif [ -e "$aptdir/updated" ]; then # offline: the lists we have still name a cached image
    log "apt: update failed; using the lists of $(date -r "$aptdir/updated" +%F)"
  else
    exit 1
  fi
fi
# The newest kernel of the suite (linux-image-amd64 depends on it), by exact version.
kpkg=$(apt-cache "${apt_opts[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
kdeb_version=$(apt-cache "${apt_opts[@]}" policy "$kpkg" | awk '/Candidate:/ {print $2}')
kver=${kpkg#linux-image-}
if [ -z "$kver" ] || [ -z "$kdeb_version" ]; then
  log "no kernel found in $SUITE"
  exit 1
fi

# Only what the guest needs of the lock: the plugin's runtime deps and pytest, not the Pulumi
# SDKs or the host's dev tools (pruned with everything only they pull in).
requirements=$(uv export --frozen --no-hashes --no-emit-project --no-header --no-annotate \
  --prune pulumi --prune pulumi-kubernetes --prune pulumi-alicloud --prune pulumi-docker-build \
  --prune pyright --prune grpcio-tools --prune kubernetes-validate --prune mypy-protobuf \
  --prune types-grpcio --prune types-protobuf --prune ruff --prune hypothesis)

key=$( { cat "$0"; echo "$kpkg=$kdeb_version"; echo "$requirements"; } | sha256sum | cut -c1-16)
out=$CACHE/$SUITE-$key
if [ -f "$out/done" ]; then
  echo "$out"
  exit 0
fi

log "building $out (kernel $kpkg $kdeb_version from $SUITE)"
t0=$(date +%s)
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
work=$out.tmp

# Kernel and modules from the Debian packages, without installing them on the host. From 7.x
# linux-image-* is a shell around linux-binary-* (vmlinuz) and linux-modules-*, under /usr/lib.
debs=("$kpkg=$kdeb_version")
for part in binary modules; do
  if apt-cache "${apt_opts[@]}" show "linux-$part-$kver" >/dev/null 2>&1; then
    debs+=("linux-$part-$kver=$kdeb_version")
  fi
done
if ! (cd "$work" && apt-get "${apt_opts[@]}" download -q "${debs[@]}" >/dev/null); then
  log "$kpkg $kdeb_version is gone from the mirror: update the lists and run again"
  rm -f "$aptdir/updated"
  exit 1
fi
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/kernel"; done
[ -e "$work/kernel/lib" ] || ln -s usr/lib "$work/kernel/lib"
for vmlinuz in "$work/kernel/boot/vmlinuz-$kver" "$work/kernel/lib/modules/$kver/vmlinuz"; do
  [ ! -f "$vmlinuz" ] || cp "$vmlinuz" "$work/vmlinuz"
done
[ -f "$work/vmlinuz" ] || { log "no vmlinuz in the $kpkg packages"; exit 1; }
depmod -b "$work/kernel" "$kver"
mods_found=()
for m in $OPTIONAL_MODULES $MODULES; do
  if modprobe -d "$work/kernel" -S "$kver" --show-depends "$m" >/dev/null 2>&1; then
    mods_found+=("$m")
  elif [[ " $MODULES " == *" $m "* ]]; then
    log "$kpkg has no module $m"
    exit 1
  fi
done

# Rootfs. minbase + our packages; docs, man pages, locales, udev's hardware database and the
# full perl (only perl-base is essential) are dead weight in a RAM disk unpacked under TCG.
# shellcheck disable=SC2016 # "$1" in a hook is the rootfs, expanded by mmdebstrap's shell
mmdebstrap --variant=minbase --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  --customize-hook='rm -rf "$1"/usr/lib/udev/hwdb.* "$1"/usr/share/perl "$1"/usr/lib/x86_64-linux-gnu/perl' \
  bookworm "$work/rootfs" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main" >&2

# Just the modules the guest loads (and what they depend on), then a depmod for them.
mods=$work/rootfs/lib/modules/$kver
mkdir -p "$mods"
modprobe -d "$work/kernel" -S "$kver" --show-depends -a "${mods_found[@]}" | awk '$1 == "insmod" {print $2}' |
  sort -u | while read -r ko; do
  rel=${ko#"$work/kernel/lib/modules/$kver/"}
  mkdir -p "$mods/$(dirname "$rel")"
  cp "$ko" "$mods/$rel"
done
# (7.x packages ship no modules.builtin*: nothing the guest loads is looked up there.)
for f in modules.order modules.builtin modules.builtin.modinfo; do
  [ ! -f "$work/kernel/lib/modules/$kver/$f" ] || cp "$work/kernel/lib/modules/$kver/$f" "$mods/"
done
depmod -b "$work/rootfs" "$kver"
# What init loads.
echo "${mods_found[*]}" >"$work/rootfs/etc/rdma-vm-modules"

# The project's locked Python packages for Debian's python3 in the guest (same 3.11, same glibc
# as this host), installed into a directory on the guest's PYTHONPATH.
echo "$requirements" >"$work/requirements.txt"
# Compiled here: under TCG the guest would spend seconds per process compiling them.
uv pip install -q --python /usr/bin/python3 --target "$work/rootfs/opt/lingjun-deps" \
  --no-deps --compile-bytecode -r "$work/requirements.txt"

# An uncompressed cpio: the guest unpacks it faster than it would decompress one under TCG.
(cd "$work/rootfs" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/rootfs.cpio"
echo "$kpkg $kdeb_version" >"$work/kernel-version"
rm -rf "$work/kernel" "$work/rootfs" "$work"/*.deb
touch "$work/done"
rm -rf "$out"
mv "$work" "$out"
find "$CACHE" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
  -regex ".*/$SUITE-[0-9a-f]{16}(\.tmp)?" ! -name "$SUITE-$key" -exec rm -rf {} +
log "built in $(($(date +%s) - t0)) s: $(du -sh "$out" | cut -f1)"
echo "$out"
