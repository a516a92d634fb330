"""Run a command the way a container runtime would hand it RDMA devices: in the caller's new
mount namespace, `/dev/infiniband` becomes an empty tmpfs holding only the device nodes of the
given DeviceSpecs (same major:minor as their host paths, mode from the permissions).

    unshare --mount --propagation private python3 -m tests.plugin.rdma.container SPECS -- CMD…

SPECS is JSON: [{"container_path", "host_path", "permissions"}, …] from an Allocate answer.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys


def main(argv: list[str]) -> int:
    specs = json.loads(argv[0])
    command = argv[argv.index("--") + 1 :]
    # Read the host nodes before the tmpfs hides them (here host and container paths coincide).
    nodes = [
        (s["container_path"], os.stat(s["host_path"]).st_rdev, s["permissions"]) for s in specs
    ]
    for directory in sorted({os.path.dirname(path) for path, _, _ in nodes}):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", directory], check=True)
    for path, rdev, permissions in nodes:
        mode = (0o444 if "r" in permissions else 0) | (0o222 if "w" in permissions else 0)
        os.mknod(path, stat.S_IFCHR | mode, rdev)
        os.chmod(path, mode)  # mknod's mode is filtered by the umask
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
