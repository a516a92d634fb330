"""Container image references: the grammar the registries use (distribution/reference), and
what counts as pinned. A value that is not a reference is never quoted back: a registry login
pasted into one (`user:password@registry/...`) must not reach a log."""

from __future__ import annotations

import re

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # distribution's \w is ASCII; Python's is Unicode
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::{_TAG})?(?:@{_DIGEST})?"
)
MAX_NAME_LENGTH = 255  # the repository name, domain included
# What a runtime takes after the grammar (go-digest): a known algorithm, its hex lower case.
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
FORM = "[registry[:port]/]repository[:tag][@sha256:digest]"


def reference_problem(image: str) -> str | None:
    """Why `image` is not an image reference (without quoting it), or None."""
    first, slash, _ = image.partition("/")
    # a first part without '.', ':' or "localhost" is a repository path, not a registry: lower
    # case only there (a runtime refuses UPPER/x:1 as an invalid reference)
    registry = slash and ("." in first or ":" in first or first == "localhost")
    if not _REFERENCE.fullmatch(image) or (not registry and first != first.lower()):
        login = "@" in image.partition("/")[0] or "://" in image
        if login:
            hint = "; a registry login never goes in one: use registryUsername and registryPassword"
        elif _REFERENCE.fullmatch(_path_lowered(image, registry=bool(registry))):
            hint = "; its repository is in lower case only (a runtime refuses upper case there)"
        else:
            hint = ""
        return f"not an image reference ({FORM}){hint}"
    name, _, digest = image.partition("@")
    algorithm, _, hex_ = digest.partition(":")
    if digest and not (
        len(hex_) == _DIGEST_HEX.get(algorithm) and hex_ == hex_.lower()
    ):  # the runtime's "invalid checksum digest format", at pull time on every node
        return (
            "its digest is not sha256 (or sha384, sha512) with its full hex in lower case, "
            "as `docker inspect` or `crane digest` print it"
        )
    port = first.rpartition(":")[2] if registry and ":" in first else ""
    if port and not 0 < int(port[:6]) <= 65535:  # digits alone: the grammar matched them
        return "its registry's port is not 1-65535"
    last = name.rpartition("/")[2]
    if ":" in last:  # a tag, not a registry's port
        name = name[: len(name) - len(last) + last.index(":")]
    if len(name) > MAX_NAME_LENGTH:
        return f"its repository name is over {MAX_NAME_LENGTH} characters"
    return None


def _path_lowered(image: str, *, registry: bool) -> str:
    """`image` with its repository path (not its registry, tag or digest) in lower case."""
    head, _, path = image.partition("/") if registry else ("", "", image)
    name, at, digest = path.partition("@")
    colon = name.find(":", name.rfind("/") + 1)
    repository, tag = (name[:colon], name[colon:]) if colon >= 0 else (name, "")
    return (f"{head}/" if registry else "") + repository.lower() + tag + at + digest


def is_pinned(image: str) -> bool:
    """True for `repo@<digest>` or `repo:tag` (a colon after the last slash, so not a port),
    of a reference that reference_problem passed."""
    if "@" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and not last.endswith(":") and not image.endswith(":latest")
