"""The Kubernetes provider the engine level builds is the release the Python SDK asks for: the
engine then runs the provider the program was written against, and a bump of one without the
other fails here, not in `make engine`."""

from __future__ import annotations

import re
from importlib.metadata import version

from infra.stack.keys import PROJECT_DIR


def _built(variable: str) -> str:
    script = (PROJECT_DIR / "tests" / "engine" / "build.sh").read_text()
    match = re.search(rf"^{variable}=v?(\S+)$", script, re.M)
    assert match, f"{variable}= not found in tests/engine/build.sh"
    return match[1]


def test_the_built_kubernetes_provider_is_the_sdks_release() -> None:
    assert _built("k8s_version") == version("pulumi-kubernetes")


def test_the_built_cli_is_not_older_than_the_sdk() -> None:
    cli = tuple(int(p) for p in _built("cli_version").split("."))
    sdk = tuple(int(p) for p in version("pulumi").split("."))

    assert cli >= sdk
