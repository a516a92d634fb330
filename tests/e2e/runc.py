"""runc for the e2e node: `runc.py REAL_RUNC SYSFS_FILE ARGS...`.

This machine has no HCA, so its /sys has no `class/infiniband`. When SYSFS_FILE names a fixture
tree, a container created with a bind mount of the node's `/sys` (the device plugin DaemonSet's
hostPath, as Kubernetes objects ask for it unchanged) gets that tree instead: the node then looks,
to what runs on it, like a node with RDMA drivers loaded. Every other call goes to runc as is.
Runs with `python -I -S`: the standard library only.
"""

import json
import os
import sys


def main() -> None:
    real, sysfs_file, *args = sys.argv[1:]
    if "create" in args and "--bundle" in args and os.path.exists(sysfs_file):
        with open(sysfs_file) as f:
            fixture = f.read().strip()
        config_path = os.path.join(args[args.index("--bundle") + 1], "config.json")
        with open(config_path) as f:
            config = json.load(f)
        changed = False
        for mount in config.get("mounts", []):
            if mount.get("source") == "/sys" and "bind" in mount.get("type", "bind"):
                mount["source"] = fixture
                changed = True
        if changed:
            with open(config_path, "w") as f:
                json.dump(config, f)
    os.execv(real, [real, *args])


main()
