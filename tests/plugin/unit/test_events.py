"""The device-plugins dir watcher on a real directory (real inotify)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from plugin.core.node.kernel_events import DirWatcher


async def test_a_name_that_is_not_utf8_does_not_hide_the_events_read_with_it(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    watcher = asyncio.create_task(DirWatcher(tmp_path, seen.append).run())
    await asyncio.sleep(0.1)  # armed

    # both created before the loop reads again: one inotify read returns the two events
    (tmp_path / os.fsdecode(b"stray-\xff")).touch()
    (tmp_path / "kubelet.sock").touch()
    for _ in range(100):
        if "kubelet.sock" in seen:
            break
        await asyncio.sleep(0.01)
    watcher.cancel()

    assert seen == [os.fsdecode(b"stray-\xff"), "kubelet.sock"]
