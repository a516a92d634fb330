"""Bad flags and unreadable config files: the plugin from its CLI exits 2 with one line naming
the flag or the file and the fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.plugin_process import PluginProcess


async def _refused(plugin: PluginProcess, config: Path | None, *flags: str) -> str:
    await plugin.start(config, *flags)
    assert await plugin.wait() == 2, plugin.output()
    output = plugin.output()
    assert "Traceback" not in output
    return output


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
async def test_a_rescan_interval_that_is_not_a_positive_number_is_refused(
    plugin: PluginProcess, value: str
) -> None:
    output = await _refused(plugin, None, f"--rescan-interval={value}")

    assert f"--rescan-interval {float(value)}: must be a number of seconds > 0" in output


@pytest.mark.parametrize("value", ["127.0.0.1:70000", "127.0.0.1:-1", "localhost", "host:http"])
async def test_a_metrics_address_without_a_port_0_to_65535_is_refused(
    plugin: PluginProcess, value: str
) -> None:
    output = await _refused(plugin, None, f"--metrics-address={value}")

    assert f"--metrics-address {value}: expected HOST:PORT with a port 0-65535" in output


async def test_a_config_that_is_a_directory_is_refused(plugin: PluginProcess) -> None:
    directory = plugin.root / "conf.d"
    directory.mkdir()

    output = await _refused(plugin, directory)

    assert f"--config {directory}: cannot be read (Is a directory)" in output


async def test_a_config_that_is_not_utf8_is_refused(plugin: PluginProcess) -> None:
    config = plugin.root / "plugin.yaml"
    config.write_bytes(b"version: v1\npools: [{name: \xff\xfe}]\n")

    output = await _refused(plugin, config)

    assert f"--config {config}: cannot be read (not UTF-8 text)" in output


async def test_a_device_plugin_dir_too_long_for_a_unix_socket_is_refused(
    plugin: PluginProcess,
) -> None:
    deep = plugin.root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)

    output = await _refused(plugin, None, "--device-plugin-dir", str(deep))

    assert f"--device-plugin-dir {deep}: the socket lingjun-rdma-rdma_hca.sock there" in output
    assert "over the 107-byte unix limit" in output
