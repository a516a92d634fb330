"""Figures for the Pulumi program (printed, never asserted).

1. The program under Pulumi mocks for the largest stack (prod), in process: the first run (pays the
   SDKs' lazy imports) and warm runs.
2. `python -m infra.commands.render` end to end as a fresh process, as `make render` runs it:
   with this environment's bytecode policy, and with a bytecode cache (cold, then warm).

    .venv/bin/python benchmarks/infra_bench.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACK = "prod"
WARM_RUNS = 10
PROCESS_RUNS = 3


def _program_under_mocks() -> None:
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    from infra.commands.offline import run_program
    from infra.stack.files import stack_config

    imported = time.perf_counter() - t0
    config, secret_keys = stack_config(STACK)
    t0 = time.perf_counter()
    result = run_program(STACK, config, secret_keys)
    first = time.perf_counter() - t0
    warm: list[float] = []
    for _ in range(WARM_RUNS):
        t0 = time.perf_counter()
        run_program(STACK, config, secret_keys)
        warm.append(time.perf_counter() - t0)
    print(f"program under mocks, stack {STACK} ({len(result.resources)} registrations):")
    print(f"  import infra.commands.render                {imported:7.3f} s")
    print(f"  first run (lazy SDK imports)       {first:7.3f} s")
    print(
        f"  warm run, median of {WARM_RUNS}            {statistics.median(warm):7.3f} s"
        f"  (min {min(warm):.3f})"
    )


def _render_process(env: dict[str, str], out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "infra.commands.render", "--stack", STACK, "--out", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def _render_end_to_end() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        as_is = [_render_process(dict(os.environ), out) for _ in range(PROCESS_RUNS)]
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cold = _render_process(cached, out)
        warm = [_render_process(cached, out) for _ in range(PROCESS_RUNS)]
    policy = "no bytecode cache" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "default"
    print(f"render end to end (python -m infra.commands.render --stack {STACK}, fresh process):")
    median = statistics.median(as_is)
    print(f"  this environment ({policy}), median of {PROCESS_RUNS}  {median:7.3f} s")
    print(f"  with a bytecode cache, first run     {cold:7.3f} s")
    print(f"  with a bytecode cache, median of {PROCESS_RUNS}  {statistics.median(warm):7.3f} s")


if __name__ == "__main__":
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    _program_under_mocks()
    _render_end_to_end()
