"""The discovery a program runs, chosen once at start from its --discovery flag."""

from __future__ import annotations

import logging
from pathlib import Path

from plugin.core.node.discovery.model import Discovery, DiscoveryError
from plugin.core.node.discovery.sysfs import SysfsDiscovery

logger = logging.getLogger(__name__)


def choose_discovery(kind: str, sysfs_root: Path, dev_root: Path) -> Discovery:
    if kind == "sysfs":
        return SysfsDiscovery(sysfs_root, dev_root)
    try:
        from plugin.core.node.discovery.verbs import VerbsDiscovery
    except ImportError as exc:
        if kind == "verbs":
            raise DiscoveryError(f"--discovery verbs needs pyverbs ({exc})") from exc
        logger.info("pyverbs unavailable (%s): sysfs discovery", exc)
        return SysfsDiscovery(sysfs_root, dev_root)
    verbs = VerbsDiscovery(sysfs_root, dev_root)
    if kind == "verbs":
        return verbs
    try:
        verbs.check_usable()
    except DiscoveryError as exc:
        logger.info("%s: sysfs discovery", exc)
        return SysfsDiscovery(sysfs_root, dev_root)
    return verbs
