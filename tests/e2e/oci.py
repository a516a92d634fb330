"""Tiny single-layer OCI image tarballs, written without a registry or a container engine.

No registry is reachable from this machine, so the pod sandbox (pause) and the test container
(busybox) images are built from host binaries and imported with `ctr -n k8s.io images import`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class Image:
    """`files` maps an absolute path in the image to a host file (copied with its mode)."""

    ref: str  # full reference, e.g. registry.k8s.io/pause:3.10
    entrypoint: list[str]
    files: dict[str, Path] = field(default_factory=dict[str, Path])
    symlinks: dict[str, str] = field(default_factory=dict[str, str])
    dirs: tuple[str, ...] = ("/dev", "/proc", "/sys", "/etc", "/tmp")


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0  # reproducible layers: same inputs, same digests
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(image: Image) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # every ancestor: an extractor need not make the dirs a layer does not list
        parents = {str(a) for p in [*image.files, *image.symlinks] for a in Path(p).parents}
        for d in sorted({*image.dirs, *parents} - {"/"}):
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "/tmp" else 0o755
            _add(tar, info)
        for path, src in sorted(image.files.items()):
            data = src.read_bytes()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), src.stat().st_mode & 0o7777
            _add(tar, info, data)
        for path, target in sorted(image.symlinks.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            _add(tar, info)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_oci_archive(image: Image, dest: Path) -> Path:
    """Write `image` as an OCI image-layout tar that `ctr images import` names `image.ref`."""
    blobs: dict[str, bytes] = {}
    layer = _blob(blobs, _layer(image), _LAYER)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": image.entrypoint, "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }
    config_desc = _blob(blobs, json.dumps(config).encode(), _CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": config_desc,
        "layers": [layer],
    }
    manifest_desc = _blob(blobs, json.dumps(manifest).encode(), _MANIFEST)
    # containerd names the imported image after this annotation
    manifest_desc["annotations"] = {
        "io.containerd.image.name": image.ref,
        "org.opencontainers.image.ref.name": image.ref.rpartition(":")[2],
    }
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()},
    }
    with tarfile.open(dest, mode="w") as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            _add(tar, info)
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            _add(tar, info, data)
    return dest


def busybox(ref: str, busybox_bin: Path, applets: list[str]) -> Image:
    """A busybox-static image with `applets` linked in /bin; `sh` is its entrypoint."""
    links = {f"/bin/{a}": "busybox" for a in applets if a != "busybox"}
    return Image(
        ref=ref, entrypoint=["/bin/sh"], files={"/bin/busybox": busybox_bin}, symlinks=links
    )


def pause(ref: str, pause_bin: Path) -> Image:
    return Image(ref=ref, entrypoint=["/pause"], files={"/pause": pause_bin})
