"""Run in the VM node: `python3 -m tests.e2e.vm_node_image REF TAR` writes an image of perftest
from the guest's own Debian packages (no registry is reachable): ib_write_bw, a shell and the
tools the sample Job's script calls, every library they load (ldd), and the verbs providers with
their config, so that ib_write_bw finds the node's rxe devices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e import oci

PROGRAMS = ("/usr/bin/ib_write_bw", "/bin/sh", "/usr/bin/seq", "/usr/bin/sleep")
PROVIDERS = Path("/usr/lib/x86_64-linux-gnu/libibverbs")
PROVIDER_CONFIG = Path("/etc/libibverbs.d")


def libraries(binary: Path) -> set[str]:
    """What the dynamic linker loads for `binary`, as ldd names it (the paths it opens)."""
    listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    found: set[str] = set()
    for line in listing.stdout.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1:
            found.add(words[words.index("=>") + 1])
        elif words and words[0].startswith("/"):  # the interpreter
            found.add(words[0])
    return {f for f in found if f.startswith("/")}


def perftest_image(ref: str) -> oci.Image:
    binaries = [Path(p) for p in PROGRAMS] + sorted(PROVIDERS.glob("*.so"))
    files = {str(b): b.resolve() for b in binaries}
    for b in binaries:
        files |= {lib: Path(lib).resolve() for lib in libraries(b)}
    files |= {str(c): c for c in PROVIDER_CONFIG.glob("*.driver")}
    return oci.Image(ref=ref, entrypoint=["/bin/sh"], files=files)


if __name__ == "__main__":
    oci.write_oci_archive(perftest_image(sys.argv[1]), Path(sys.argv[2]))
