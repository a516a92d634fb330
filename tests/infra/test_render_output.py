"""The render's --out directory: what it may write to (paths, symbolic links, file systems that
refuse it, directories its user cannot write or enter), what a render again keeps (files saved
there, each file's mode, the directory's owner) and what it deletes (only its own listed files)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.commands.render import MARKER, OutputError, _remove_render, render
from infra.stack.keys import PROJECT_DIR
from tests.infra.helpers import RENDER, _cli


def test_removing_a_previous_render_deletes_only_its_listed_unchanged_files(
    tmp_path: Path,
) -> None:
    out = tmp_path / "dev"
    render("dev", out)
    (out / "mywork.txt").write_text("precious")  # saved there while a render ran
    (out / "plan.md").write_text("edited")

    kept = _remove_render(out)

    assert kept == out
    assert sorted(p.name for p in out.iterdir()) == ["mywork.txt", "plan.md"]
    assert (out / "mywork.txt").read_text() == "precious"


def test_a_file_saved_into_out_while_a_render_runs_survives(tmp_path: Path) -> None:
    render("local", tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-m", RENDER, "--stack", "local", "--out", "out"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)  # about when the render checks --out, plans, and swaps it
    (tmp_path / "out" / "mywork.txt").write_text("precious")
    _, stderr = proc.communicate(timeout=180)

    survivors = [p for p in tmp_path.rglob("mywork.txt") if p.read_text() == "precious"]
    assert len(survivors) == 1, stderr
    assert proc.returncode in (0, 2), stderr
    if proc.returncode == 0:  # saved after the swap: in the new render's directory
        assert survivors[0].parent == tmp_path / "out"
    else:
        assert "Traceback" not in stderr


@pytest.mark.parametrize("listed", ["../../victim.txt", "ABSOLUTE"])
def test_a_render_list_naming_files_elsewhere_deletes_nothing_there(
    tmp_path: Path, listed: str
) -> None:
    out = tmp_path / "a" / "out"
    render("dev", out)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    name = str(victim) if listed == "ABSOLUTE" else listed
    marker = json.loads((out / MARKER).read_text())
    data = victim.read_bytes()
    marker["files"][name] = [len(data), hashlib.sha256(data).hexdigest()]
    (out / MARKER).write_text(json.dumps(marker))

    with pytest.raises(
        OutputError, match=r"\.lingjun-render names '.*'( \([0-9]+ characters\))?, a file a render"
    ):
        render("dev", out)

    assert victim.read_text() == "keep me"


def test_a_render_list_naming_a_file_a_render_never_names_deletes_nothing(
    tmp_path: Path,
) -> None:
    """The marker lists a user's file beside the render's, with its right size and digest (a
    forged or hand-edited list): render refuses the dir; the file stays."""
    out = tmp_path / "out"
    render("dev", out)
    precious = out / "precious.txt"
    precious.write_text("keep me")
    marker = json.loads((out / MARKER).read_text())
    data = precious.read_bytes()
    marker["files"]["precious.txt"] = [len(data), hashlib.sha256(data).hexdigest()]
    (out / MARKER).write_text(json.dumps(marker))

    with pytest.raises(OutputError, match=r"names 'precious\.txt', a file a render never writes"):
        render("dev", out)

    assert precious.read_text() == "keep me"


def test_a_render_marker_nested_too_deep_is_someone_elses_file_not_a_traceback(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("[" * 100000 + "]" * 100000)

    with pytest.raises(OutputError, match=r"its \.lingjun-render is not JSON, so nothing there"):
        render("dev", out)


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (lambda d: "x" * 300, "File name too long"),
        (lambda d: "/".join(["y" * 200] * 25), "File name too long"),
        (lambda d: "/proc/newdir", "cannot write in /proc"),
    ],
    ids=["name-too-long", "path-too-long", "proc"],
)
def test_an_out_the_file_system_refuses_is_one_line(
    tmp_path: Path, setup: Callable[[Path], str], said: str
) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", setup(tmp_path), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line
    assert list(tmp_path.iterdir()) == []  # no staging dir left beside it


def test_an_out_below_a_regular_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")

    done = _cli(RENDER, "--stack", "local", "--out", "afile/sub", cwd=tmp_path)

    assert done.returncode == 2
    assert f"--out {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is not a directory" in (
        done.stderr
    )


def test_an_out_that_is_a_link_to_nothing_is_refused_and_nothing_made_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")

    done = _cli(RENDER, "--stack", "dev", "--out", "out", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "a symbolic link to nothing" in done.stderr
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("out", ["loop/out", "loop"])
def test_an_out_under_or_at_a_symlink_loop_is_one_line(tmp_path: Path, out: str) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")

    done = _cli(RENDER, "--stack", "dev", "--out", out, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.endswith("a symbolic link on its path leads back to itself: fix the link")


def test_an_empty_out_is_refused_not_taken_as_the_current_directory(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "argument --out: empty: name the directory to render into" in done.stderr
    assert not list(tmp_path.iterdir())


def test_an_out_with_a_line_break_is_said_on_one_line(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", "x\nINJECTED", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    (said,) = done.stdout.splitlines()
    assert re.fullmatch(r"render: local: wrote [0-9]+ files to x\\nINJECTED", said)
    assert (tmp_path / "x\nINJECTED").is_dir()


def test_a_render_whose_report_cannot_be_printed_is_still_a_render(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", RENDER, "--stack", "local", "--out", "out"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=180, check=False,
        )  # fmt: skip

    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert line.startswith("render: local: wrote ")
    assert line.endswith(" files to out (stdout: No space left on device)")
    assert (tmp_path / "out" / "plan.md").is_file()


def test_an_existing_empty_out_keeps_its_owner_group_and_mode(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1234, 1234)  # the tests run as root, as CI does
    out.chmod(0o2770)  # a shared group's directory

    done = _cli(RENDER, "--stack", "dev", "--out", "out", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    kept = out.stat()
    assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (1234, 1234, 0o2770)
    assert {p.stat().st_gid for p in out.iterdir()} == {1234}  # its files join its group


def test_a_render_again_keeps_each_files_mode(tmp_path: Path) -> None:
    """A file of the last render made 0600 went back to 0644 (podenv's --out keeps its)."""
    out = tmp_path / "out"
    render("dev", out)
    (out / "plan.md").chmod(0o600)

    render("dev", out, ["lingjunNodeCount=5"])

    assert "desiredSize: '5'" in (out / "plan.md").read_text()
    assert stat.S_IMODE((out / "plan.md").stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir() if p.name != "plan.md"} == {0o644}


@pytest.mark.parametrize(
    ("owner", "said"),
    [("nobody", "is not writable by this user: make it writable (chmod u+w), or name another "
                "directory"),
     ("root", "is root's and not writable by this user: render as root, or name another "
              "directory")],
)  # fmt: skip
def test_an_out_its_user_cannot_write_is_named_not_its_parent(
    shared_dir: Path, owner: str, said: str
) -> None:
    """Run as nobody (CI runs as root, which writes anywhere): a read-only --out was said as
    its parent being unwritable, where the render's copy of it had failed; chmod is the fix of
    its owner only."""
    shared = shared_dir
    out = shared / "ro"
    out.mkdir()
    shutil.chown(out, owner)
    out.chmod(0o555)

    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-m", RENDER, "--stack", "dev", "--out", str(out)],
        cwd=shared, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "HOME": str(shared)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"render: dev: error: --out {out}: {said}"]
    assert not [p for p in shared.iterdir() if p.name.startswith(".render-")]


def test_an_out_of_ones_own_in_a_dir_one_cannot_write_is_rendered_in_place(
    shared_dir: Path,
) -> None:
    """Run as nobody: `--out` its own, its parent root's (nothing can be staged beside it) was
    `cannot write in <parent> (Permission denied)`, with no fix; the user can write the dir."""
    parent = shared_dir / "parent"
    out = parent / "out"
    out.mkdir(parents=True)
    shutil.chown(out, "nobody", "nogroup")
    parent.chmod(0o755)  # root's

    def render_as_nobody(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
             "-m", RENDER, "--stack", "dev", "--out", str(out), *flags],
            cwd=shared_dir, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR),
                                 "HOME": str(shared_dir)},
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    first = render_as_nobody()
    second = render_as_nobody("--set", "lingjunNodeCount=7")

    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert "desiredSize: '7'" in (out / "plan.md").read_text()  # the second one, whole
    assert (out / ".lingjun-render").exists()
    assert sorted(p.name for p in parent.iterdir()) == ["out"]


def test_an_out_under_a_dir_its_user_cannot_enter_names_that_dir(shared_dir: Path) -> None:
    """Run as nobody: it was `--out ...: Permission denied`, with no fix."""
    closed = shared_dir / "closed"
    closed.mkdir()
    closed.chmod(0o700)  # root's
    out = closed / "sub"

    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-m", RENDER, "--stack", "dev", "--out", str(out)],
        cwd=shared_dir, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "HOME": str(shared_dir)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: dev: error: --out {out}: {closed} cannot be entered or written by this user: "
        "name a directory it can write in"
    ]
