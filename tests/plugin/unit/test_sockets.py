"""Which socket file is at a path: the kubelet's, made again on each restart."""

from __future__ import annotations

import socket
from pathlib import Path

from plugin.core.kube.sockets import file_id


def test_a_socket_file_made_again_is_another_file_whatever_inode_it_gets(tmp_path: Path) -> None:
    """ext4 gives a freed inode number out again at once: a kubelet.sock made again had the
    old one's, and its kubelet was taken for the one before (a flapping one, held off)."""
    path = tmp_path / "kubelet.sock"
    ids = []
    for _ in range(3):
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))
            ids.append(file_id(path))
            assert file_id(path) == ids[-1]  # the same file, looked at again
        path.unlink()

    assert len(set(ids)) == 3
    assert file_id(path) is None
