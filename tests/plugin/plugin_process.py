"""The plugin as a subprocess from its CLI (integration, VM and benchmark levels)."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from plugin.launch import DiscoveryKind, LaunchSpec, LogLevel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PluginProcess:
    """The device plugin on a sysfs and dev root (a fixture tree's, or the VM's own) with a
    temp plugin dir and a metrics port of its own."""

    def __init__(
        self,
        root: Path,
        plugin_dir: Path,
        *,
        sysfs: Path,
        dev: Path,
        discovery: DiscoveryKind = "sysfs",
        log_level: LogLevel = "debug",
        netns: str | None = None,
    ) -> None:
        self.root = root
        self.plugin_dir = plugin_dir
        self.sysfs = sysfs
        self.dev = dev
        self.discovery = discovery
        self.log_level = log_level
        self.netns = netns  # run inside this network namespace (`ip netns exec` execs it)
        self.metrics_port = free_port()
        self.log = root / "plugin.log"
        self.proc: asyncio.subprocess.Process | None = None

    def twin(self, root: Path) -> PluginProcess:
        """A second instance on the same device-plugins dir and trees, logging under `root`."""
        root.mkdir()
        return PluginProcess(root, self.plugin_dir, sysfs=self.sysfs, dev=self.dev)

    def spec(self, config: Path | None = None, **overrides: Any) -> LaunchSpec:
        """What every test here launches, as the launch contract says it; `overrides` are
        LaunchSpec fields (rescan_interval=600, discovery="auto")."""
        spec = LaunchSpec(
            config=config,
            sysfs_root=self.sysfs,
            dev_root=self.dev,
            device_plugin_dir=self.plugin_dir,
            discovery=self.discovery,
            rescan_interval=0.1,
            metrics_address=f"127.0.0.1:{self.metrics_port}",
            log_level=self.log_level,
        )
        return dataclasses.replace(spec, **overrides)

    def argv(self, config: Path | None = None, *raw: str, **overrides: Any) -> list[str]:
        """The command line; `raw` flags go last, as given (the CLI's own refusals are tested
        with them), in place of the spec's own (a flag given twice is refused)."""
        netns = ("ip", "netns", "exec", self.netns) if self.netns else ()
        python, m, module, *spelled = self.spec(config, **overrides).command(sys.executable)
        named = {a.split("=", 1)[0] for a in raw if a.startswith("--")}
        pairs = zip(spelled[::2], spelled[1::2], strict=True)
        kept = [a for flag, value in pairs if flag not in named for a in (flag, value)]
        return [*netns, python, m, module, *kept, *raw]

    async def start(self, config: Path | None = None, *raw: str, **overrides: Any) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(config, *raw, **overrides), stdout=log, stderr=log
            )

    async def terminate(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 10)

    async def close(self) -> None:
        """Fixture teardown: stop it if running (killed after 5 s), then print its log, which
        pytest shows only when the test failed."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        print(self.output())

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), 10)

    def write_config(self, text: str) -> Path:
        path = self.root / "plugin.yaml"
        path.write_text(text)
        return path

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    async def said(self, text: str, limit: float = 10.0) -> str:
        """The output once it holds `text` (polled); fails with the output after `limit` s."""
        for _ in range(int(limit / 0.05)):
            if text in self.output():
                break
            await asyncio.sleep(0.05)
        output = self.output()
        assert text in output, output
        return output
