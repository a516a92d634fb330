#!/usr/bin/env bash
# Boot the Soft-RoCE VM (built and cached by build.sh) with the project's code appended to its
# initramfs, run the tests marked `rdma` inside it, and exit with their pytest exit code.
# The guest's console (kernel, init, pytest) is written to out/rdma/guest-<kernel suite>.log.
# RDMA_PYTEST_ARGS="-k health -x" passes extra pytest arguments to the guest;
# RDMA_VM_KERNEL=forky boots that Debian suite's kernel instead of bookworm's (build.sh).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
repo=$PWD
timeout_s=${RDMA_VM_TIMEOUT:-1800} # TCG on 2 shared cores: generous, but never hang CI

image=$(tests/plugin/rdma/vm/build.sh)
mkdir -p out/rdma
log=$repo/out/rdma/guest-${RDMA_VM_KERNEL:-bookworm}.log
work=$(mktemp -d /tmp/rdma-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The project's files as the guest's /src (what git would check out, so a fresh clone and a
# working tree test the same thing), and /init; a second cpio appended to the cached one:
# the kernel unpacks concatenated archives in order.
mkdir -p "$work/root/src"
git ls-files -z --cached --others --exclude-standard -- common plugin tests pyproject.toml |
  xargs -0 cp --parents -t "$work/root/src"
install -m 0755 tests/plugin/rdma/vm/init "$work/root/init"
install -D -m 0644 tests/plugin/rdma/vm/rxe-pair "$work/root/opt/rxe-pair"
# Bytecode compiled here by the same Debian python3.11 as the guest's: each guest process would
# otherwise compile the project's modules again, slowly, under TCG.
/usr/bin/python3 -m compileall -q "$work/root/src"
(cd "$work/root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/code.cpio"
cat "$image/rootfs.cpio" "$work/code.cpio" >"$work/initrd"

append="console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4"
if [ -n "${RDMA_PYTEST_ARGS:-}" ]; then
  append+=" RDMA_PYTEST_ARGS=\"$RDMA_PYTEST_ARGS\""
fi

echo "run.sh: booting $(cat "$image/kernel-version") (TCG, no KVM here); log: $log"
t0=$(date +%s)
# No NIC: the tests need no network but the veth pair made inside the guest.
boot() {
  timeout --foreground "$timeout_s" qemu-system-x86_64 \
    -machine q35 -accel tcg,tb-size=256 -cpu max -smp 2 -m 2048 \
    -display none -monitor none -serial stdio -no-reboot -nic none \
    -kernel "$image/vmlinuz" -initrd "$work/initrd" -append "$append" \
    </dev/null 2>&1 | sed -u 's/\r$//' | tee "$log" || true
}
# Under TCG with 2 vCPUs, the 7.x kernel now and then panics in early boot, before our init
# runs (seen once in CI: "Fatal exception in interrupt" at 1 s). Such a boot tested nothing of
# ours: it is booted again, at most twice, and said. A panic after init started is a failure.
for try in 1 2 3; do
  boot
  if grep -q '^init: .* started ' "$log" || ! grep -q 'Kernel panic' "$log"; then
    break
  fi
  cp "$log" "${log%.log}.panic-$try.log"
  echo "run.sh: the guest kernel panicked before init started (boot $try of 3; its log: ${log%.log}.panic-$try.log)" >&2
done
elapsed=$(($(date +%s) - t0))

rc=$(sed -n 's/^RDMA-PYTEST-EXIT=\([0-9]*\)$/\1/p' "$log" | tail -1)
if [ -z "$rc" ]; then
  echo "run.sh: the guest stopped without a pytest result after ${elapsed} s (see $log)" >&2
  exit 1
fi
echo "run.sh: guest pytest exit code $rc after ${elapsed} s in the VM"
if [ "$rc" -eq 5 ]; then
  echo "run.sh: pytest ran no test in the guest: that is a failure here" >&2
fi
exit "$rc"
