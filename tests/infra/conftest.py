"""Run the Pulumi program under mocks once per (stack, overrides) and share the result; the
fixtures the infra commands' tests share."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.commands.offline import Registered, RunResult, manifests, run_program
from infra.stack.files import stack_config
from infra.stack.keys import PROJECT_DIR

# Every committed stack file: a new one is covered by every stack-parametrized test.
STACKS = tuple(sorted(p.name.split(".")[1] for p in (PROJECT_DIR / "stacks").glob("Pulumi.*.yaml")))

_cache: dict[tuple[str, tuple[str, ...]], RunResult] = {}


def run(stack: str, *overrides: str) -> RunResult:
    """The program's registrations and outputs for a stack plus KEY=VALUE overrides."""
    key = (stack, overrides)
    if key not in _cache:
        config, secret_keys = stack_config(stack, list(overrides))
        _cache[key] = run_program(stack, config, secret_keys)
    return _cache[key]


def of_type(result: RunResult, type_: str) -> list[Registered]:
    return [r for r in result.resources if r.type == type_]


def one(result: RunResult, type_: str) -> Registered:
    found = of_type(result, type_)
    assert len(found) == 1, f"{type_}: {[r.name for r in found]}"
    return found[0]


def k8s_objects(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests(result) if m["kind"] == kind]


def k8s_object(result: RunResult, kind: str, name: str) -> dict[str, Any]:
    found = [m for m in k8s_objects(result, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture
def mounted_out(tmp_path: Path) -> Iterator[Path]:
    """--out as a container's volume: a mount point, which no rename can move."""
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], check=True)
    yield out
    subprocess.run(["umount", "-l", str(out)], check=True)
