"""The command lines of render, deploy, podenv and the node agents: an unknown flag, a bad or
repeated flag value, a malformed --set is refused in one line that quotes back no value (one may
be a secret) and points at --help; line breaks and bytes a terminal cannot take are escaped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.stack.keys import PROJECT_DIR
from tests.infra.helpers import DEPLOY, RENDER, SENTINEL, _cli


def test_unrecognized_arguments_are_refused_without_being_echoed(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--password={SENTINEL}",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 2
    assert "1 argument(s) it does not take (--password among them) (values not quoted back" in (
        done.stderr
    )
    assert "e.g. --set KEY=VALUE (--help lists the flags)" in done.stderr
    assert SENTINEL not in done.stderr


def test_a_program_without_set_gives_no_set_example(tmp_path: Path) -> None:
    done = _cli("plugin.deviceplugin", "--bogus-flag", cwd=tmp_path)

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "rdma-device-plugin: error: 1 argument(s) it does not take (--bogus-flag among them) "
        "(values not quoted back: one may be a secret); each flag takes its value after '=' or "
        "as the next argument (--help lists the flags)"
    ]


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("plugin.deviceplugin", ("--discovery", SENTINEL)),
        ("plugin.deviceplugin", ("--rescan-interval", SENTINEL)),
        ("plugin.deviceplugin", ("--metrics-address", SENTINEL)),
        ("plugin.podenv", ("--hcas", "mlx5_0", "--family", SENTINEL)),
        (DEPLOY, (SENTINEL, "--stack", "dev")),
        (RENDER, ("--stack", f"{SENTINEL}!", "--out", "out")),
    ],
    ids=["choice", "float", "launch-spec", "podenv-choice", "deploy-action", "stack-name"],
)  # fmt: skip
def test_a_bad_flag_value_is_one_line_that_does_not_quote_it(
    tmp_path: Path, module: str, args: tuple[str, ...]
) -> None:
    done = _cli(module, *args, cwd=tmp_path)

    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.endswith("(--help lists the flags)")
    assert SENTINEL not in done.stderr


@pytest.mark.parametrize(
    ("prog", "args", "flag"),
    [(RENDER, ("--stack", "dev", "--stack=prod", "--out", "out"), "--stack"),
     (DEPLOY, ("preview", "--stack", "dev", "--stack", "prod"), "--stack"),
     ("plugin.podenv", ("--family", "ipv6", "--family", "ipv4"), "--family")],
    ids=["render", "deploy", "podenv"],
)  # fmt: skip
def test_a_flag_that_takes_one_value_given_twice_is_refused(
    tmp_path: Path, prog: str, args: tuple[str, ...], flag: str
) -> None:
    """argparse kept the last silently: `--stack dev --stack prod` rendered prod."""
    done = _cli(prog, *args, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"python -m {prog}: error: {flag}: given twice: keep one (--help lists the flags)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("prog", "args"),
    [("plugin.deviceplugin", ("--config", "/tmp/bad\nINJECTED line")),
     ("plugin.deviceplugin", ("--kubeconfig", "/tmp/bad\nINJECTED line")),
     ("plugin.dra", ("--kubeconfig", "/tmp/bad\nINJECTED line", "--node-name", "n1")),
     ("plugin.podenv", ("--hcas", "mlx5_0", "--sysfs-root", "/tmp/bad\nINJECTED line")),
     (DEPLOY, ("preview", "--stack", "local", "--project-dir", "/tmp/bad\nINJECTED line"))],
    ids=["plugin-config", "plugin-kubeconfig", "dra-kubeconfig", "podenv-sysfs", "deploy-project"],
)  # fmt: skip
def test_a_line_break_in_a_path_is_escaped_in_its_flags_refusal(
    tmp_path: Path, prog: str, args: tuple[str, ...]
) -> None:
    """It made a second line, which deploy even prefixed as its own."""
    done = _cli(prog, *args, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "INJECTED" in ln]
    assert "/tmp/bad\\nINJECTED line" in line
    assert not [ln for ln in done.stderr.splitlines() if ln.startswith(("INJECTED", "deploy: INJ"))]


def test_a_set_without_equals_never_quotes_what_may_be_a_password(tmp_path: Path) -> None:
    done = _cli(
        RENDER, "--stack", "prod", "--out", "out", f"--set=registryPassword:{SENTINEL}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 2
    assert "--set number 1: expected KEY=VALUE" in done.stderr
    assert SENTINEL not in done.stderr


def test_a_set_key_that_is_no_key_is_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set=:=x", cwd=tmp_path)

    assert done.returncode == 2
    assert "--set number 1: expected KEY=VALUE with KEY a config key" in done.stderr


def test_a_key_set_twice_on_the_command_line_is_refused(tmp_path: Path) -> None:
    twice = ("--set=nonHostNetwork=true", "--set=nonHostNetwork=false")
    done = _cli(RENDER, "--stack", "dev", "--out", "out", *twice, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].endswith("--set nonHostNetwork: given twice: keep one")


def test_a_set_value_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out",
         b"--set=registryUsername=a\xffb"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        "--set registryUsername: its value is not UTF-8 text: retype it"
    )
    assert "Traceback" not in done.stderr


def test_a_render_to_a_path_stdout_cannot_encode_is_said_escaped(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out-ü"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PYTHONIOENCODING": "ascii"},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(" files to out-\\xfc\n")
