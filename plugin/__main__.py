"""`python -m plugin`: the package holds three programs; this names them (the brief and habit
call the package itself)."""

import sys

from common.terminal import say, write_stdout

PROGRAMS = (
    "python -m plugin.deviceplugin: the device plugin (rdma/hca for the kubelet)\n"
    "python -m plugin.dra: the DRA driver (Kubernetes 1.34+)\n"
    "python -m plugin.podenv: a pod's NCCL settings (its init container)\n"
    "each takes --help\n"
)

if sys.argv[1:] in (["--help"], ["-h"]):
    write_stdout(PROGRAMS)
    sys.exit(0)
for line in ("python -m plugin: name one of its programs:", *PROGRAMS.splitlines()):
    say(line)
sys.exit(2)
