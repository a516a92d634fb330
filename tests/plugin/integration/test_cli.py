"""Bad flags and bad config files: the plugin from its CLI exits 2 with one line naming the
flag or the file and the fix, never a traceback, and never blocks on what it reads."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.userfiles import MAX_DIGITS
from plugin.config import MAX_DEVICE_IDS, MAX_POOLS
from plugin.launch import MAX_UNIX_PATH, RESCAN_INTERVAL_RANGE
from tests.plugin.plugin_process import PluginProcess


async def _refused(plugin: PluginProcess, config: Path | None, *flags: str) -> str:
    await plugin.start(config, *flags)
    assert await plugin.wait() == 2, plugin.output()
    output = plugin.output()
    assert "Traceback" not in output
    return output


LOW, HIGH = RESCAN_INTERVAL_RANGE


@pytest.mark.parametrize(
    "value", ["0", "-1", "1e-9", str(LOW / 2), str(HIGH + 1), "1e61", "1e-400", "1e400", "-0"]
)
async def test_a_rescan_interval_outside_its_range_is_refused_as_typed(
    plugin: PluginProcess, value: str
) -> None:
    """As a float, 1e-400 was said as 0.0, 1e400 as inf, -0 as -0.0."""
    output = await _refused(plugin, None, f"--rescan-interval={value}")

    assert f"--rescan-interval {value}: must be {LOW:g}-{HIGH:g} seconds" in output


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1_0", "\u0665", " 5", "0x10", ""])
async def test_a_rescan_interval_that_is_no_plain_number_is_refused(
    plugin: PluginProcess, value: str
) -> None:
    output = await _refused(plugin, None, f"--rescan-interval={value}")

    assert "argument --rescan-interval: not a number like 5 or 0.5" in output


@pytest.mark.parametrize(
    ("value", "said"),
    [("-inf", "argument --rescan-interval: not a number like 5 or 0.5"),
     ("-nan", "argument --rescan-interval: not a number like 5 or 0.5"),
     ("-1e3", "--rescan-interval -1e3: must be"),
     ("9" * 400, "--rescan-interval text of 400 characters: must be")],
    ids=["minus-inf", "minus-nan", "negative-exponent-form", "400-digits"],
)  # fmt: skip
async def test_a_rescan_interval_as_the_next_argument_is_read_as_a_value(
    plugin: PluginProcess, value: str, said: str
) -> None:
    """argparse took -inf and -1e3 for flags ("expected one argument"), and 400 digits were
    "not a number": each now meets the same check as --rescan-interval=VALUE."""
    output = await _refused(plugin, None, "--rescan-interval", value)

    assert said in output


async def test_an_abbreviated_flag_is_not_taken_for_the_whole(plugin: PluginProcess) -> None:
    output = await _refused(plugin, None, "--rescan=1")

    assert "argument(s) it does not take (--rescan among them)" in output


async def test_a_metrics_port_over_65535_is_named(plugin: PluginProcess) -> None:
    output = await _refused(plugin, None, "--metrics-address=127.0.0.1:99999")

    assert "--metrics-address text of 15 characters: port 99999 is over 65535" in output


@pytest.mark.parametrize("value", ["127.0.0.1:-1", "localhost", "host:http", "127.0.0.1:٩٤٦٠"])
async def test_a_metrics_address_without_a_port_0_to_65535_is_refused(
    plugin: PluginProcess, value: str
) -> None:
    output = await _refused(plugin, None, f"--metrics-address={value}")

    said = f"--metrics-address text of {len(value)} characters: expected HOST:PORT with a port"
    assert said in output
    assert value not in output  # never quoted: a secret typed into the wrong flag stays unsaid


@pytest.mark.parametrize(
    ("host", "said"),
    [("Hunter2Secret", "its host does not resolve here"),
     ("256.1.1.1", "its host does not resolve here"),
     ("192.0.2.1", "its host is not an address of this node"),
     ("127.0.0.1", "is in use (another instance, or another program): pick a free port")],
    ids=["a-password", "not-an-ip", "not-ours", "port-taken"],
)  # fmt: skip
async def test_a_metrics_address_that_cannot_be_listened_on_is_said_without_its_value(
    plugin: PluginProcess, host: str, said: str
) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    value = f"{host}:{taken.getsockname()[1]}"
    try:
        output = await _refused(plugin, None, f"--metrics-address={value}")
    finally:
        taken.close()

    (line,) = [x for x in output.splitlines() if "--metrics-address" in x]
    assert said in line
    assert host not in output
    assert "Errno" not in line


def _fifo(root: Path) -> Path:
    path = root / "plugin.fifo"
    os.mkfifo(path)
    return path


def _directory(root: Path) -> Path:
    path = root / "conf.d"
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (_directory, "a directory"),
        (_fifo, "a FIFO"),  # opened for reading, it would block until a writer came
        (lambda root: Path("/dev/zero"), "a character device"),  # read whole, endless
    ],
)
async def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(
    plugin: PluginProcess, make: object, kind: str
) -> None:
    assert callable(make)
    config = make(plugin.root)

    output = await _refused(plugin, config)

    assert f"--config {config}: cannot be read ({kind}, not a regular file)" in output


async def test_a_config_over_a_configmaps_size_is_refused(plugin: PluginProcess) -> None:
    config = plugin.write_config("# " + "x" * (1 << 20) + "\n")

    output = await _refused(plugin, config)

    assert f"--config {config}: cannot be read (over 1024 KiB)" in output


async def test_a_config_that_is_not_utf8_is_refused(plugin: PluginProcess) -> None:
    config = plugin.root / "plugin.yaml"
    config.write_bytes(b"version: v1\npools: [{name: \xff\xfe}]\n")

    output = await _refused(plugin, config)

    assert f"--config {config}: cannot be read (not UTF-8 text)" in output


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("pools:\n  - name: hca\n    maxAllocations: " + "9" * 5000 + "\n", "5000 digits"),
        ('{"pools": [{"name": "hca", "maxAllocations": ' + "9" * 5000 + "}]}", "5000 digits"),
        ("pools: " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid YAML"),
        ('{"pools": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
    ids=["yaml-5000-digits", "json-5000-digits", "yaml-deep", "json-deep"],
)
async def test_a_config_with_absurd_numbers_or_nesting_is_one_line(
    plugin: PluginProcess, text: str, why: str
) -> None:
    config = plugin.write_config(text)

    output = await _refused(plugin, config)

    assert f"{config}: not valid YAML" in output
    assert why in output
    assert f"at most {MAX_DIGITS}" in output or "digits" not in why


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        ("pools:\n  - name: hca\n    mode: shared\n    mode: exclusive\n", "line 4, column 5: ",
         "mode"),
        ('{"pools": [{"name": "a", "name": "b"}]}', "", "name"),
        ('{"pools": [{"S3cret": "a", "S3cret": "b"}]}', "", "S3cret"),
    ],
    ids=["yaml", "json", "not-a-key-of-ours"],
)  # fmt: skip
async def test_a_key_given_twice_is_refused_not_silently_the_last(
    plugin: PluginProcess, text: str, where: str, key: str
) -> None:
    config = plugin.write_config(text)

    output = await _refused(plugin, config)

    assert (
        f"{config}: not valid YAML ({where}{key} given twice: keep one): fix the syntax"
    ) in output


async def test_more_pools_than_a_node_can_serve_are_refused(plugin: PluginProcess) -> None:
    pools = ", ".join(f"{{name: p{i}, maxAllocations: 1}}" for i in range(20_000))
    config = plugin.write_config(f"pools: [{pools}]\n")

    output = await _refused(plugin, config)

    assert f"pools: 20000 pools: at most {MAX_POOLS}" in output


async def test_pools_whose_ids_add_up_past_the_limit_are_refused(plugin: PluginProcess) -> None:
    pools = ", ".join(f"{{name: p{i}, maxAllocations: {MAX_DEVICE_IDS}}}" for i in range(2))
    config = plugin.write_config(f"pools: [{pools}]\n")

    output = await _refused(plugin, config)

    assert f"maxAllocations add up to {2 * MAX_DEVICE_IDS}: at most {MAX_DEVICE_IDS}" in output


async def test_a_device_plugin_dir_too_long_for_a_unix_socket_is_refused(
    plugin: PluginProcess,
) -> None:
    deep = plugin.root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)

    output = await _refused(plugin, None, "--device-plugin-dir", str(deep))

    assert f"--device-plugin-dir {deep}: the socket lingjun-rdma-rdma_hca.sock there" in output
    assert f"over the {MAX_UNIX_PATH}-byte unix limit" in output


async def test_a_flag_given_twice_is_refused_not_the_last_kept(plugin: PluginProcess) -> None:
    output = await _refused(plugin, None, "--rescan-interval", "0.1", "--rescan-interval=5")

    assert "error: --rescan-interval: given twice: keep one" in output


async def test_a_device_plugin_dir_that_is_a_symlink_loop_is_refused(
    plugin: PluginProcess,
) -> None:
    (plugin.root / "a").symlink_to(plugin.root / "b")
    (plugin.root / "b").symlink_to(plugin.root / "a")

    output = await _refused(plugin, None, "--device-plugin-dir", str(plugin.root / "a"))

    assert f"--device-plugin-dir {plugin.root / 'a'} is a symbolic link loop: name a dir" in output


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--device-plugin-dir=", "--device-plugin-dir: empty: name a path"),
        ("--config=", "--config: empty: name a path"),
    ],
)
async def test_an_empty_path_flag_is_refused(plugin: PluginProcess, flag: str, said: str) -> None:
    output = await _refused(plugin, None, flag)

    assert said in output


async def test_a_config_path_the_kernel_refuses_is_one_line(plugin: PluginProcess) -> None:
    config = plugin.root / ("c" * 300) / "plugin.yaml"

    output = await _refused(plugin, config)

    assert "cannot be read (File name too long)" in output


async def test_a_very_long_path_is_cut_in_the_middle_of_its_line(plugin: PluginProcess) -> None:
    config = Path("/nonexistent") / ("c" * 5000)

    output = await _refused(plugin, config)

    (line,) = output.splitlines()
    assert len(line) < 2100
    assert line.startswith("rdma-device-plugin: --config /nonexistent/ccc")
    assert "… (5" in line  # how long it was
    assert line.endswith("cannot be read (File name too long): point it at the plugin's YAML file")


def test_a_bad_flag_with_stderr_full_still_exits_2(plugin: PluginProcess) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            plugin.argv(None, "--rescan-interval=0"), stdout=full, stderr=full, timeout=60,
            check=False,
        )  # fmt: skip

    assert done.returncode == 2


@pytest.mark.parametrize(
    "module",
    ["plugin.deviceplugin", "plugin.podenv", "infra.commands.render", "infra.commands.deploy"],
)
def test_help_to_a_full_stdout_is_one_line(module: str) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"], stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=60, check=False,
        )  # fmt: skip

    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.endswith("cannot write the help to stdout (No space left on device)")


@pytest.mark.parametrize("flag", ["--sysfs-root", "--dev-root", "--cdi-dir"])
async def test_a_directory_flag_naming_a_file_is_refused_at_start(
    plugin: PluginProcess, short_tmp: Path, flag: str
) -> None:
    afile = short_tmp / "a-file"
    afile.write_text("x")

    output = await _refused(plugin, None, f"{flag}={afile}")

    assert f"argument {flag}: is a regular file, not a directory: name a directory" in output


@pytest.mark.parametrize(
    "text", ["", "\n", "# only a comment\n"], ids=["empty", "blank", "comment"]
)
async def test_a_config_that_holds_nothing_is_refused_not_taken_for_defaults(
    plugin: PluginProcess, text: str
) -> None:
    output = await _refused(plugin, plugin.write_config(text))

    assert "holds no config (empty, or comments only): write at least `version: v1`" in output


@pytest.mark.parametrize(
    ("pool", "said"),
    [
        ("maxAlloc: 5", "pools[0].maxAlloc: unknown key: did you mean maxAllocations?"),
        ("zqxjwvkp: 5", "pools[0].zqxjwvkp: unknown key: remove it or fix its spelling"),
        ("Allocations: 5", "pools[0].Allocations: unknown key: did you mean maxAllocations?"),
    ],
    ids=["cut-short", "unlike-any", "cut-short-at-its-start"],
)
async def test_an_unknown_pool_key_is_named_with_the_known_one_it_is_near(
    plugin: PluginProcess, pool: str, said: str
) -> None:
    output = await _refused(plugin, plugin.write_config(f"pools:\n- name: hca\n  {pool}\n"))

    assert said in output


def test_a_path_flag_that_is_not_utf8_is_refused_naming_it(plugin: PluginProcess) -> None:
    done = subprocess.run(
        [*plugin.argv(None), b"--device-plugin-dir=/tmp/dp\xff"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "argument --device-plugin-dir: not UTF-8: name a path in UTF-8" in done.stderr


def test_the_package_itself_names_its_programs_and_each_answers_its_help() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "plugin", "--help"], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    bare = subprocess.run(
        [sys.executable, "-m", "plugin"], capture_output=True, text=True, timeout=60, check=False
    )

    assert listed.returncode == 0, listed.stderr
    assert bare.returncode == 2
    assert listed.stdout in bare.stderr
    modules = re.findall(r"^python -m (plugin\.\w+):", listed.stdout, re.MULTILINE)
    assert modules == ["plugin.deviceplugin", "plugin.dra", "plugin.podenv"]
    for module in modules:
        helped = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert helped.returncode == 0, f"{module}: {helped.stderr}"


async def test_a_line_break_in_a_path_never_breaks_a_log_line(plugin: PluginProcess) -> None:
    """A serving plugin logs what it cannot read under --sysfs-root: the path is escaped, as a
    peer's words are (it made a line of its own that could pass for the plugin's)."""
    await plugin.start(None, "--sysfs-root", str(plugin.root / "x\nINJECTED line"))

    await plugin.said("INJECTED line/class does not exist")
    await plugin.terminate()

    assert "x\\nINJECTED line/class does not exist" in plugin.output()
    assert not [line for line in plugin.output().splitlines() if line.startswith("INJECTED")]
