"""Every number within its stated range: a stack key's number or duration, an RdmaJobSpec's
counts, and the bounds the kubelet and unix sockets set are refused in one line before planning,
each bound itself accepted; and docs/config.md states every range as the code defines it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from common.userfiles import MAX_DIGITS, MAX_FILE_BYTES
from infra.stack.keys import DURATION_RANGES, PROJECT_DIR, format_seconds
from infra.stack.keys import seconds as keys_seconds
from infra.stack.model import MAX_NODE_COUNT
from infra.stack.samples import JOB_RANGES, JobSpecError, RdmaJobSpec
from plugin.config import MAX_ALLOCATIONS_LIMIT, MAX_DEVICE_IDS, MAX_POOLS
from plugin.deviceplugin.wire import KUBELET_MESSAGE_MAX
from plugin.launch import MAX_UNIX_PATH, RESCAN_INTERVAL_RANGE
from tests.infra.helpers import RENDER, _cli

LOW, HIGH = RESCAN_INTERVAL_RANGE


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("rdmaRescanInterval", "9" * 61, "a number of 61 digits (at most 20)"),
        ("rdmaRescanInterval", "9" * 19, f"must be 1-{HIGH:g} whole seconds"),
        ("rdmaRescanInterval", "0", f"must be 1-{HIGH:g} whole seconds"),
        ("jobAwaitTimeout", "99999999999999999h", "not within 1s..168h"),
        ("jobAwaitTimeout", "9" * 5000 + "s", "not within 1s..168h"),
        ("jobAwaitTimeout", "0s", "not within 1s..168h"),
        ("jobAwaitTimeout", "169h", "not within 1s..168h"),
        ("pluginAwaitTimeout", "25h", "not within 1s..24h"),
        ("lingjunNodeCount", "1001", "1001 is not 0..1000"),
        ("lingjunNodeCount", "9" * 20, "a number of 20 digits is not 0..1000"),
        ("lingjunNodeCount", "9" * 400, "a number of 400 digits (at most 20)"),
        ("lingjunNodeCount", "9" * 4301, "a number of 4301 digits (at most 20)"),
        ("rdmaMaxAllocations", "100001", "is not within 1-100000"),
        ("rdmaMaxAllocations", "9" * 5000, "a number of 5000 digits (at most 20)"),
    ],
)
def test_a_number_outside_its_range_is_refused_in_one_line_before_planning(
    tmp_path: Path, key: str, value: str, said: str
) -> None:
    done = _cli(
        RENDER,
        "--stack",
        "dev",
        "--out",
        "out",
        f"--set={key}={value}",
        cwd=tmp_path,
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if f"lingjun-rdma:{key}:" in ln]
    assert said in line
    assert len(line) < 300  # the value is not echoed at length
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "seconds"), sorted(DURATION_RANGES.items()))
def test_each_durations_bounds_are_accepted(
    tmp_path: Path, key: str, seconds: tuple[int, int]
) -> None:
    for bound in seconds:
        done = _cli(
            RENDER, "--stack", "dev", "--out", f"out-{bound}",
            f"--set={key}={format_seconds(bound)}", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("text", "seconds"), [("1h30m", 5400), ("2h0m5s", 7205), ("90s", 90)])
def test_a_duration_of_several_units_is_taken_as_go_writes_it(text: str, seconds: int) -> None:
    assert keys_seconds("jobAwaitTimeout", text, "30m") == (seconds, [])


@pytest.mark.parametrize(("field", "bounds"), sorted(JOB_RANGES.items()))
def test_an_rdma_job_spec_count_outside_its_range_is_refused(
    field: str, bounds: tuple[int, int]
) -> None:
    low, high = bounds
    RdmaJobSpec(name="j", image="busybox:1.36", command=("true",), **{field: high})

    for value in (low - 1, high + 1):
        with pytest.raises(JobSpecError, match=f"Job j: {field}: {value} is not within"):
            RdmaJobSpec(name="j", image="busybox:1.36", command=("true",), **{field: value})


def test_a_resource_name_whose_socket_path_is_too_long_is_refused_before_planning(
    tmp_path: Path,
) -> None:
    name = "rdma." + "d" * 50 + ".example.com/hca"  # valid, but its socket path is 124 bytes

    done = _cli(RENDER, "--stack", "dev", "--out", "out",
                f"--set=rdmaResourceName={name}", cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert "over the 105-byte limit of a unix socket" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("api", "refused"), [("devicePlugin", True), ("dra", False)])
def test_shared_ids_over_the_kubelets_message_limit_are_refused_before_planning(
    tmp_path: Path, api: str, refused: bool
) -> None:
    """100000 IDs of 46 characters take 4.4 MiB without any NUMA node: the kubelet would end
    every ListAndWatch. The DRA driver publishes slices instead: no such bound."""
    # a name of 40 characters makes the IDs long; DRA names no resource (its key is refused)
    name = [f"--set=rdmaResourceName=rdma/{'s' * 40}"] if api == "devicePlugin" else []
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set=rdmaApi={api}",
                "--set=kubernetesVersion=1.34.1-aliyun.1", "--set=rdmaMaxAllocations=100000",
                *name, cwd=tmp_path)  # fmt: skip

    if refused:
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1].endswith(
            "lingjun-rdma:rdmaMaxAllocations: 100000 IDs of up to 46 characters (the pool's name "
            "and a number) are over the 4 MiB the kubelet reads of a device list, even without "
            "NUMA nodes: at most 71278 fit (--set rdmaMaxAllocations=71278), or a shorter "
            "rdmaResourceName"
        )
        assert not (tmp_path / "out").exists()
    else:
        assert done.returncode == 0, done.stderr


def test_the_config_docs_state_every_range_as_the_code_defines_it() -> None:
    readme = (PROJECT_DIR / "docs" / "config.md").read_text()
    low, high = RESCAN_INTERVAL_RANGE
    rows = {
        "`--rescan-interval`, `rdmaRescanInterval`": (
            f"{low:g}-{high:g} s (the stack key in whole seconds: {max(1, math.ceil(low))}-"
            f"{high:g})"
        ),
        "`maxAllocations`, `rdmaMaxAllocations`": (
            f"1-{MAX_ALLOCATIONS_LIMIT} (a device plugin's list also within the kubelet's "
            f"{KUBELET_MESSAGE_MAX >> 20} MiB)"
        ),
        "shared IDs of all pools together": f"{MAX_DEVICE_IDS}",
        "pools in the plugin config": f"1-{MAX_POOLS}",
        "a file the project reads; a number in it": (
            f"{MAX_FILE_BYTES >> 20} MiB; {MAX_DIGITS} digits"
        ),
        "socket path in `--device-plugin-dir`": f"{MAX_UNIX_PATH} bytes (grpc's limit)",
        "`lingjunNodeCount`": f"0-{MAX_NODE_COUNT}",
        **{
            f"`{key}`": f"{format_seconds(lo)}-{format_seconds(hi)}"
            for key, (lo, hi) in DURATION_RANGES.items()
        },
    }
    rows[", ".join(f"`{n}`" for n in JOB_RANGES).join(("`RdmaJobSpec` ", ""))] = ", ".join(
        f"{lo}-{hi}" for lo, hi in JOB_RANGES.values()
    )
    for value, stated in rows.items():
        assert f"  | {value} | {stated} |" in readme, value
