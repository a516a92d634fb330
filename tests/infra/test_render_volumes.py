"""An --out that is a mount point (a container's volume, a fresh ext4 with its lost+found) is
rendered in place, a full or read-only one is said and the previous render kept whole; what
killed renders left in it or beside it is removed by the next render, and nothing else."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.commands.render import MARKER, OutputError, render
from infra.stack.keys import PROJECT_DIR
from tests.infra.helpers import RENDER, _cli


def test_an_out_that_is_a_mount_point_is_rendered_in_place(mounted_out: Path) -> None:
    render("dev", mounted_out)
    again = render("local", mounted_out)  # replaces dev's render, file by file

    assert os.path.ismount(mounted_out)
    assert sorted(mounted_out.iterdir()) == again
    assert "local" in (mounted_out / "plan.md").read_text()
    marker = json.loads((mounted_out / MARKER).read_text())
    assert sorted(marker["files"]) == sorted(p.name for p in again if p.name != MARKER)

    (mounted_out / "mywork.txt").write_text("precious")
    with pytest.raises(OutputError, match="holds files a render did not write"):
        render("dev", mounted_out)
    assert (mounted_out / "mywork.txt").read_text() == "precious"


def test_a_volume_too_full_for_a_render_keeps_the_previous_one_whole(tmp_path: Path) -> None:
    """A render in place needs room for its files beside the previous render's: when there is
    none, the previous render is left whole (it was left partial), and once there is room the
    next render goes through."""
    out = tmp_path / "vol"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=44k", "tmpfs", str(out)], check=True)
    try:
        small = render("local", out, ["sampleJobs=[]", "perftestImage="])
        before = {p.name: p.read_bytes() for p in small}
        with pytest.raises(OutputError) as refused:
            render("dev", out)
        left = {p.name: p.read_bytes() for p in out.iterdir()}
        # the room it names is enough: the volume grown by just that much takes the render
        needs = int(re.findall(r"needs (\d+) KiB free", str(refused.value))[0])
        fs = os.statvfs(out)
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        size = used + needs * 1024
        subprocess.run(["mount", "-o", f"remount,size={size}", str(out)], check=True)
        again = render("dev", out)
        after = sorted(out.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)

    assert str(refused.value).startswith(
        f"--out {out}: cannot write in it (No space left on device): the previous render there "
        "is kept whole: this render needs "
    )
    assert left == before
    assert "job-lingjun-rdma-perftest.yaml" in [p.name for p in again]
    assert after == again


def test_a_volume_under_a_read_only_root_is_rendered_in_place(tmp_path: Path) -> None:
    """`docker run --read-only -v $PWD/out:/out`: the render cannot stage beside the volume."""
    root = tmp_path / "root"
    out = root / "vol"
    out.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
        with pytest.raises(OSError, match="Read-only file system"):
            (root / "probe").write_text("")  # the root is read-only indeed

        written = render("dev", out)
        again = render("dev", out)
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)
        subprocess.run(["umount", "-l", str(root)], check=True)

    assert written == again
    assert "plan.md" in [p.name for p in again]


def test_a_fresh_ext4_volume_as_out_is_rendered_and_its_lost_found_kept(tmp_path: Path) -> None:
    image, out = tmp_path / "vol.img", tmp_path / "out"
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    out.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(out)], check=True)
    try:
        first = render("dev", out)
        again = render("dev", out)
        assert (out / "lost+found").is_dir()
        assert [p.name for p in first] == [p.name for p in again]
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)


def test_a_read_only_mount_point_as_out_says_so(mounted_out: Path, tmp_path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mounted_out)], check=True)

    done = _cli(RENDER, "--stack", "local", "--out", str(mounted_out), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: local: error: --out {mounted_out}: cannot write in it (Read-only file system)"
    ]


@pytest.mark.parametrize("exists", [True, False])
def test_an_out_on_a_read_only_file_system_says_so_not_chmod(
    mounted_out: Path, tmp_path: Path, exists: bool
) -> None:
    """Not a mount point itself (that is rendered in place): a dir in one, or a new one there.
    The user is root, whom no chmod would help."""
    out = mounted_out / "prev"
    if exists:
        out.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mounted_out)], check=True)

    done = _cli(RENDER, "--stack", "local", "--out", str(out), cwd=tmp_path)

    where = f"{out}:" if exists else f"{out}: {mounted_out}"
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: local: error: --out {where} is on a read-only file system: name a directory "
        "on a writable one"
    ]


def test_temp_files_a_killed_render_left_in_a_mount_point_are_removed_by_the_next(
    mounted_out: Path,
) -> None:
    """Every later render refused them as files it did not write, for good. A temp file of a
    name a render never writes is someone's: still refused."""
    render("dev", mounted_out)
    (mounted_out / ".plan.md.tmp-k2j4h6g8").write_text("# half")
    (mounted_out / f".{MARKER}.tmp-a1b2c3d4").write_text('{"fi')
    render("dev", mounted_out)
    (mounted_out / ".notes.txt.tmp-a1b2c3d4").write_text("mine")
    with pytest.raises(OutputError, match=r"\.notes\.txt\.tmp-a1b2c3d4"):
        render("dev", mounted_out)

    assert not [
        p.name for p in mounted_out.iterdir() if ".tmp-" in p.name and "notes" not in p.name
    ]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_what_killed_renders_left_beside_out_is_removed_by_the_next_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A staging dir and an old render's dir whose render is dead; a live render's staging dir
    and an old dir holding someone's file stay (9 dirs after 20 kills were left for good)."""
    out = tmp_path / "out"
    render("dev", out)
    dead, alive = _dead_pid(), os.getpid()
    staging = tmp_path / f".render-{dead}-abcd1234"
    staging.mkdir()
    (staging / "plan.md").write_text("# half")
    old = tmp_path / f".render-{dead}-abcd1234.old"
    shutil.copytree(out, old)
    kept_old = tmp_path / f".render-{dead}-efgh5678.old"
    shutil.copytree(out, kept_old)
    (kept_old / "mywork.txt").write_text("precious")
    running = tmp_path / f".render-{alive}-ijkl9012"
    running.mkdir()

    render("dev", out)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out", kept_old.name, running.name]
    )
    assert [p.name for p in kept_old.iterdir()] == ["mywork.txt"]


def test_a_render_killed_while_renaming_into_a_mount_point_is_finished_by_the_next(
    mounted_out: Path, tmp_path: Path
) -> None:
    """SIGKILL (an OOM kill) after two of its files were renamed in, before its list: the next
    render refused them as files a render did not write, for good."""
    render("dev", mounted_out)
    killer = (
        "import os, signal, sys\n"
        "real, calls = os.replace, [0]\n"
        "def dying(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*args, **kwargs)\n"
        "os.replace = dying\n"
        "from infra.commands.render import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    done = subprocess.run(
        [sys.executable, "-c", killer, "--stack", "dev", "--out", str(mounted_out),
         "--set", "namespace=lingjun-rdma-b"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [p.name for p in mounted_out.iterdir() if ".tmp-" in p.name]  # it died midway

    again = render("dev", mounted_out)

    assert sorted(mounted_out.iterdir()) == again
    assert not [p.name for p in mounted_out.iterdir() if ".tmp-" in p.name]
    marker = json.loads((mounted_out / MARKER).read_text())
    assert sorted(marker["files"]) == sorted(p.name for p in again if p.name != MARKER)
