"""Offline render: run the program under Pulumi's mock engine, write every manifest and plan.md.

    python -m infra.commands.render --stack dev --out out/dev [--set KEY=VALUE]...

No Pulumi CLI and no credentials: the stack's YAML and Pulumi.yaml's defaults are loaded here
(mocks read neither), every Kubernetes object is checked against the Kubernetes 1.34 schema, and
the output directory is replaced only when everything succeeded.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below, which are most of a short run
    from infra.commands.interrupt import exit_quietly

    exit_quietly("render")

import argparse
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, cast

import kubernetes_validate  # pyright: ignore[reportMissingTypeStubs]
import yaml
from kubernetes_validate.utils import (  # pyright: ignore[reportMissingTypeStubs]
    ValidationError as SchemaError,
)

from common.terminal import Parser, one_line, say, write_stdout
from common.userfiles import (
    MAX_FILE_BYTES,
    TEMP_MARK,
    UnreadableError,
    on_read_only_fs,
    read_text,
    shown,
    staged,
    temp_of,
    user_name,
    write_atomically,
)
from infra.commands.interrupt import deferred
from infra.commands.offline import (
    RenderError,
    RunResult,
    check_unique,
    manifests,
    normalize,
    object_id,
    run_program,
)
from infra.stack.credentials import SECRET
from infra.stack.files import StackFileError, stack_config, stack_help, stack_name
from infra.stack.keys import PROJECT, StackConfigError, qualified
from infra.stack.samples import JobSpecError
from plugin.config import ConfigError

KUBERNETES_VERSION = "1.34.0"
# Written into every directory a render makes, listing what it wrote: only a directory that
# holds nothing else, unchanged, is ever replaced.
MARKER = ".lingjun-render"


# The names a render gives its files: kind-namespace-name.yaml (Kubernetes names: lower case),
# plan.md. A marker listing any other name (a user's notes.txt, ../x) is not one it wrote.
_RENDER_NAME = re.compile(r"plan\.md|kustomization\.yaml|[a-z]+-[a-z0-9][a-z0-9.-]{0,250}\.yaml")
KUSTOMIZATION = "kustomization.yaml"


class OutputError(RuntimeError):
    """The output directory is refused, or cannot be written: one line naming it."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, the plugin's config file) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar(  # pyright: ignore[reportUnknownMemberType]
        "tag:yaml.org,2002:str", value, style=style
    )


_Dumper.add_representer(str, _str)


# Custom resources of the Prometheus Operator: no bundled schema; the API server checks them
# against its CRDs (make engine does, and tests/monitoring against the operator's own CRDs).
CUSTOM_GROUPS = ("monitoring.coreos.com/",)


def validate(manifest: dict[str, Any]) -> None:
    """Strict schema check against Kubernetes 1.34 (bundled schemas, no network)."""
    if str(manifest.get("apiVersion", "")).startswith(CUSTOM_GROUPS):
        return
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except SchemaError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise RenderError(f"{object_id(manifest)}: {path or '(top)'}: {exc.message}") from None


def file_name(manifest: dict[str, Any]) -> str:
    meta = manifest.get("metadata", {})
    parts = [manifest["kind"].lower(), meta.get("namespace"), meta.get("name")]
    return "-".join(p for p in parts if p) + ".yaml"


def kustomization(stack: str, objects: dict[str, dict[str, Any]]) -> str:
    """`kubectl apply -k` of the render, for a cluster without Pulumi: every object but one
    holding a secret render does not know (said in the file: create it yourself)."""
    held = sorted(n for n, o in objects.items() if SECRET in json.dumps(o))
    lines = [
        f"# kubectl apply -k of stack {stack}'s Kubernetes objects, as `python -m "
        "infra.commands.render` wrote them.",
        *(
            f"# not listed: {n} holds a secret this render does not know: make it yourself"
            for n in held
        ),
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        *(f"- {n}" for n in sorted(objects) if n not in held),
    ]
    return "\n".join(lines) + "\n"


def plan_markdown(stack: str, result: RunResult, files: list[str]) -> str:
    """Cloud resources with their inputs, the Kubernetes files, and the stack outputs."""
    lines = [
        f"# Plan: stack `{stack}` (offline render, Pulumi mocks)",
        "",
        "## Cloud resources",
        "",
    ]
    # Registration order varies between runs (resources resolve concurrently): sort by name.
    cloud = sorted(
        (r for r in result.resources if r.custom and not r.is_kubernetes_object),
        key=lambda r: (r.name, r.type),
    )
    if not cloud:
        lines.append("(none: this stack adopts an existing cluster)")
    for r in cloud:
        lines += [f"### `{r.name}` ({r.type})", "", "```yaml"]
        lines.append(yaml.safe_dump(normalize(r.inputs), sort_keys=True).rstrip())
        lines += ["```", ""]
    lines += ["", "## Kubernetes objects", ""]
    lines += [f"- `{f}`" for f in sorted(files)]
    lines += ["", "## Outputs", "", "| output | value |", "| --- | --- |"]
    for key, (value, secret) in result.outputs.items():
        shown = SECRET if secret else json.dumps(value)
        lines.append(f"| `{key}` | `{shown}` |")
    return "\n".join(lines) + "\n"


def check_out(out: Path) -> None:
    """`out` must be new, empty, or hold only what a render wrote, unchanged (its MARKER lists
    each file with its size and digest): render replaces it as a whole, and must never delete
    what it did not write."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"--out {out}: not a directory: name a new or empty directory")
    above = out.parent  # os.path's: False, not PermissionError, under a dir it cannot enter
    while not os.path.exists(above) and above != above.parent:
        above = above.parent
    if not os.path.isdir(above):  # --out under a regular file: mkdir would say "File exists"
        raise OutputError(f"--out {out}: {above} is not a directory")
    if not os.path.isdir(out):
        if not os.access(above, os.W_OK | os.X_OK):
            why = _read_only(above) or (
                "cannot be entered or written by this user: name a directory it can write in"
            )
            raise OutputError(f"--out {out}: {above} {why}")
        return
    if not os.path.ismount(out) and not os.access(out, os.W_OK | os.X_OK):
        # its copy would get its mode too, and the render fail inside that copy
        why = _read_only(out) or _not_writable(out)
        raise OutputError(f"--out {out}: {why}")
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as exc:
        raise OutputError(f"--out {out}: {exc.strerror}") from None
    if not entries:
        return
    written = _listed(out) if MARKER in entries else {}
    if isinstance(written, str):  # else every file would be named as someone's
        raise OutputError(
            f"--out {out}: its {MARKER} {written}, so nothing there is known to be a render's: "
            "move the files away, or name a new or empty directory"
        )
    if os.path.ismount(out):  # a file system's own: never a render's, never in the way
        entries = [n for n in entries if n not in _FILE_SYSTEMS_OWN]
    temps = [n for n in entries if _render_temp(n)]  # a render killed while writing here
    if staged := [n for n in temps if n.startswith(f".{MARKER}{TEMP_MARK}")]:
        written = _finished(out, written, staged)
    for name in temps:
        (out / name).unlink(missing_ok=True)
        entries.remove(name)
    ours = {MARKER}
    foreign = [
        n for n in entries if n not in ours and (n not in written or _digest(out / n) != written[n])
    ]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
        raise OutputError(
            f"--out {out}: holds files a render did not write, or changed since ({shown}): it "
            "would be replaced as a whole; move them away, or name a new or empty directory"
        )


# What a file system keeps at its root (ext4's lost+found): --out a fresh volume holds it.
_FILE_SYSTEMS_OWN = frozenset({"lost+found"})


def _finished(
    out: Path, written: dict[str, list[object]], staged: list[str]
) -> dict[str, list[object]]:
    """What `out` holds after a render was killed while renaming its files into it: each file
    as its old list or the killed render's (staged whole before the first rename) has it. The
    list is written anew, so that the next render sees its files, not someone's."""
    known = [written]
    known += [listed for n in staged if isinstance(listed := _listed(out, n), dict)]
    files: dict[str, list[object]] = {}
    for listed in known:
        for name, digest in listed.items():
            if name not in files and _digest(out / name) == digest:
                files[name] = digest
    if files != written:
        marker = {
            "writer": "python -m infra.commands.render (finished by the next)",
            "files": files,
        }
        write_atomically(out / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
    return files


def _render_temp(name: str) -> bool:
    """A temp file a render makes for one of its files when it writes in place."""
    target, mark, _ = name[1:].partition(TEMP_MARK)
    return (
        name.startswith(".")
        and bool(mark)
        and (target == MARKER or _RENDER_NAME.fullmatch(target) is not None)
        and temp_of(target, name)
    )


# What a render names the directories it makes beside --out: its staging dir, and the old
# render's while the new one is swapped in. Its pid is in the name: one a killed render left is
# removed by the next render there, never one a render still running uses.
_STAGING = re.compile(r"\.render-(?P<pid>[0-9]{1,10})-[A-Za-z0-9_]{8}(?P<old>\.old)?")


def _remove_leftovers(parent: Path) -> None:
    """The staging and old dirs that renders killed midway left in `parent`: a staging dir
    holds only what that render wrote; an old one is removed as a render (what else appeared in
    it is kept, and the dir with it)."""
    left: list[tuple[Path, re.Match[str]]] = []
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        left = [
            (Path(e.path), m) for e in entries
            if (m := _STAGING.fullmatch(e.name)) and e.is_dir(follow_symlinks=False)
        ]  # fmt: skip
    for path, match in left:
        if _alive(int(match["pid"])):
            continue
        if match["old"]:
            _remove_render(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no pid is: left alone
    return True


def _written(out: Path) -> dict[str, list[object]]:
    """What the render that made `out` wrote there: name -> [size, sha256]; {} when unknown."""
    listed = _listed(out)
    return {} if isinstance(listed, str) else listed


def _listed(out: Path, marker: str = MARKER) -> dict[str, list[object]] | str:
    """`out`'s MARKER (or a staged one) as a render writes it, or why it is none."""
    try:
        data: object = json.loads(read_text(out / marker))
    except UnreadableError as exc:
        return f"cannot be read ({exc})"
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return "is not JSON"
    files = cast(dict[str, object], data).get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        return "lists no files"
    listed = cast(dict[object, list[object]], files)
    # a list naming anything else is not one a render wrote: nothing it names is ever deleted
    odd = [n for n in listed if not (isinstance(n, str) and _RENDER_NAME.fullmatch(n))]
    if odd:
        return f"names {shown(odd[0])}, a file a render never writes"
    return cast(dict[str, list[object]], listed)


def _text_digest(text: str) -> list[object]:
    """[size, sha256] of what a render writes for `text`, as `_digest` reads it back."""
    data = text.encode()
    return [len(data), hashlib.sha256(data).hexdigest()]


def _digest(path: Path) -> list[object] | None:
    """[size, sha256] of a regular file (read only when it is one, and small); else None."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return None
        return [st.st_size, hashlib.sha256(path.read_bytes()).hexdigest()]
    except OSError:
        return None


def _read_only(path: Path) -> str | None:
    """Why no chmod helps, when `path` is on a read-only file system."""
    with contextlib.suppress(OSError):
        if on_read_only_fs(path):
            return "is on a read-only file system: name a directory on a writable one"
    return None


def _not_writable(out: Path) -> str:
    """Why this user cannot write in `out`, and the fix: chmod only helps its owner."""
    owner = out.stat().st_uid
    if owner == os.geteuid():
        return (
            "is not writable by this user: make it writable (chmod u+w), or name another directory"
        )
    name = user_name(owner)
    return f"is {name}'s and not writable by this user: render as {name}, or name another directory"


def _out_dir(text: str) -> Path:
    if not text:  # Path("") is the current directory: a variable that expanded to nothing
        raise argparse.ArgumentTypeError("empty: name the directory to render into")
    return Path(text)


def render(stack: str, out: Path, overrides: list[str] | None = None) -> list[Path]:
    """Render the stack into `out` (replaced as a whole, only on success); returns the files."""
    try:
        # resolving a link to nothing would render somewhere else (os.path's: False, not
        # PermissionError, under a dir this user cannot enter, which check_out names)
        if os.path.islink(out) and not os.path.exists(out):
            try:
                out.stat()
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise RuntimeError from None  # a loop: said below
            raise OutputError(
                f"--out {out}: a symbolic link to nothing: name a directory, or make the one "
                "it points to first"
            )
        out = out.resolve()
        check_out(out)
    except OSError as exc:  # a name too long, a dir that cannot be entered, a cwd gone
        raise OutputError(f"--out {out}: {exc.strerror or exc}") from None
    except OutputError:
        raise
    except RuntimeError:  # pathlib's "Symlink loop from ..."
        raise OutputError(
            f"--out {out}: a symbolic link on its path leads back to itself: fix the link"
        ) from None
    config, secret_keys = stack_config(stack, overrides)
    with deferred():  # Pulumi's mock engine is an asyncio loop
        result = run_program(stack, config, secret_keys)
    check_unique(result)
    objects = manifests(result)
    for manifest in objects:
        validate(manifest)
    try:
        kept = _write(out, stack, result, objects)
    except OSError as exc:
        raise OutputError(f"--out {out}: cannot write in {out.parent} ({exc.strerror})") from None
    if kept == out:
        raise OutputError(
            f"--out {out}: rendered in place (a mount point), but files appeared in it while "
            "this render ran; they are kept beside it"
        )
    if kept is not None:
        raise OutputError(
            f"--out {out}: rendered, but files appeared in the previous render while this one "
            f"ran; they are kept, with that render, in {kept}"
        )
    return sorted(out.iterdir())


def _write(out: Path, stack: str, result: RunResult, objects: list[dict[str, Any]]) -> Path | None:
    """Write into a new directory beside `out`, then swap it in: `out` holds either the old
    render or the new one, never a mix. Of the old one, only the files it listed, unchanged,
    are deleted: returns where it stays when anything else appeared in it meanwhile."""
    names = [file_name(m) for m in objects]
    texts = {
        name: yaml.dump(manifest, Dumper=_Dumper, sort_keys=False)
        for name, manifest in zip(names, objects, strict=True)
    }
    texts["plan.md"] = plan_markdown(stack, result, names)
    texts[KUSTOMIZATION] = kustomization(stack, dict(zip(names, objects, strict=True)))
    files = {name: _text_digest(text) for name, text in texts.items()}
    marker = {"writer": f"python -m infra.commands.render --stack {stack}", "files": files}
    texts[MARKER] = json.dumps(marker, indent=1, sort_keys=True) + "\n"  # last: it lists the rest
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(out.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".render-{os.getpid()}-", dir=out.parent))
    except OSError:
        # a volume under a read-only root (docker run --read-only -v), or a directory of one's
        # own in one that is not (check_out found it writable)
        if os.path.ismount(out) or out.is_dir():
            return _write_in_place(out, texts)
        raise
    old = staging.with_name(staging.name + ".old")
    try:
        _like(staging, out)  # in here: a name too long fails its stat, and staging is removed
        for name, text in texts.items():
            (staging / name).write_bytes(text.encode())
            with contextlib.suppress(FileNotFoundError):  # a file made 0600 stays so
                (staging / name).chmod(stat.S_IMODE((out / name).lstat().st_mode))
        if out.exists():
            try:
                out.rename(old)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                return _write_in_place(out, texts)  # a mount point: cannot be swapped
        staging.rename(out)
    except BaseException:
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # ours alone: made by mkdtemp above
    return _remove_render(old)


def _like(staging: Path, out: Path) -> None:
    """The directory that replaces `out` keeps its owner, group and mode (a shared group's
    setgid dir stays one); a new one is like mkdir's, not mkdtemp's private one."""
    try:
        kept = out.stat()
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        return
    # before chmod: chown clears setgid. Not root: a directory cannot be given away; its
    # mode is still kept.
    with contextlib.suppress(PermissionError):
        os.chown(staging, kept.st_uid, kept.st_gid)
    staging.chmod(stat.S_IMODE(kept.st_mode))


def _write_in_place(out: Path, texts: dict[str, str]) -> Path | None:
    """`out` is a mount point (a container's volume), which no rename can swap, or in a
    directory where nothing new can be made: every new file is written beside the old ones
    first, so a volume too full for both keeps the previous render whole; then, signals held
    off, each is renamed onto its name, the previous render's other files (where unchanged)
    are removed, and the MARKER goes last. Returns `out` when other files are in it."""
    old = _written(out)
    ours = {**old, MARKER: _digest(out / MARKER)} if old else {}
    taken = [n for n in texts if (out / n).exists() and _digest(out / n) != ours.get(n)]
    if taken:  # appeared while this render ran (check_out saw none): never overwritten
        raise OutputError(
            f"--out {out}: {', '.join(taken[:3])} appeared in it while this render ran; move "
            "them away and render again"
        )
    temps: dict[str, str] = {}
    try:
        try:
            for name, text in texts.items():
                temps[name] = staged(out / name, text)
        except OSError as exc:
            said = [f"--out {out}: cannot write in it ({exc.strerror})"]
            if old:
                said.append("the previous render there is kept whole")
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                said.append(f"this render needs {_room(out, texts)} KiB free beside it")
            raise OutputError(": ".join(said)) from None
        with deferred():
            for name in [n for n in texts if n != MARKER]:
                os.replace(temps.pop(name), out / name)
            for gone, digest in old.items():
                if gone not in texts and _digest(out / gone) == digest:
                    (out / gone).unlink()
            os.replace(temps.pop(MARKER), out / MARKER)  # last: it lists what is now there
    finally:
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    others = [p.name for p in out.iterdir() if p.name not in texts]
    return out if set(others) - _FILE_SYSTEMS_OWN else None


def _room(out: Path, texts: dict[str, str]) -> int:
    """KiB that `texts` take as files in `out`: each a whole number of its blocks."""
    try:
        block = os.statvfs(out).f_frsize or 4096
    except OSError:
        block = 4096
    size = sum(-(-len(t.encode()) // block) * block for t in texts.values())
    return -(-size // 1024)


def _remove_render(directory: Path) -> Path | None:
    """Delete what a render listed in `directory`, where unchanged, then the directory; None
    when it is gone, else `directory` (something else is in it)."""
    if not directory.exists():
        return None
    for name, digest in _written(directory).items():
        if _digest(directory / name) == digest:
            (directory / name).unlink()
    (directory / MARKER).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        return directory
    return None


def _as_flags(problem: str, overrides: list[str]) -> str:
    """A refusal's fix in render's own terms: a key is set with --set (or in the stack file),
    and one given with --set is removed by dropping that flag (the program says what
    `pulumi preview` users run)."""
    for item in overrides:
        key = item.partition("=")[0]
        full = key if ":" in key else qualified(key)
        problem = problem.replace(f"(pulumi config rm {full})", f"(render: drop --set {key})")
    problem = _CONFIG_SET.sub(lambda m: f"(--set {m['key']}={m['value']})", problem)
    return _LIST_SET.sub(lambda m: f"({m['render']})", problem)


# The program's fixes for one key (`pulumi config set lingjun-rdma:K V`), and for a list key
# (the CLI's item-by-item recipe, followed by render's own form)
_CONFIG_SET = re.compile(
    rf"\(pulumi config set {re.escape(PROJECT)}:(?P<key>[A-Za-z0-9]+) (?P<value>[^()]*)\)"
)
_LIST_SET = re.compile(r"\((?:pulumi config [^()]*?; )+render: (?P<render>--set [^()]*)\)")


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m infra.commands.render", __doc__)
    parser.add_argument("--stack", required=True, type=stack_name, help=stack_help())
    parser.add_argument("--out", type=_out_dir, required=True, help="directory to (re)write")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key of the stack, e.g. --set nonHostNetwork=true",
    )
    args = parser.parse_args(argv)
    stack = args.stack if len(args.stack) <= 100 else shown(args.stack)
    try:
        files = render(args.stack, args.out, args.set)
    except (OutputError, StackFileError) as exc:  # one line, whatever the path holds
        say(f"render: {stack}: error: {one_line(str(exc), 2000, keep_end=True)}")
        return 2
    except (RenderError, StackConfigError, JobSpecError, ConfigError) as exc:
        for problem in str(exc).splitlines():  # a line per key refused, each a whole message
            say(f"render: {stack}: error: {_as_flags(problem, args.set)}")
        return 1
    except OSError as exc:  # the last boundary: a file-system error anywhere, stdout full
        where = f"{exc.filename}: " if exc.filename else ""
        say(f"render: {stack}: error: {where}{exc.strerror or exc}")
        return 2
    wrote = f"render: {stack}: wrote {len(files)} files to {one_line(str(args.out))}"
    try:
        write_stdout(wrote + "\n")
    except OSError as exc:  # the render is done: only its report could not be printed
        say(f"{wrote} (stdout: {exc.strerror or exc})")
    return 0


if __name__ == "__main__":
    from infra.commands.interrupt import guard

    guard(main)
