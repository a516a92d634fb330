"""Files a user hands us (the plugin config, a stack file): read only when they are regular
files of bounded size, and parsed strictly, so that no such file can block a read, exhaust
memory, or have one of two values win silently."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# A ConfigMap holds at most 1 MiB: no config this project reads is legitimately larger.
MAX_FILE_BYTES = 1 << 20
# int64 has 19 digits: a longer number is a slip (and Python refuses to parse 4300 digits).
MAX_DIGITS = 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableError(ValueError):
    """A file that is not read: the message says why (`a FIFO, not a regular file`)."""


def file_kind(mode: int) -> str:
    """What a stat mode names, as a user would say it (`a FIFO`, `a regular file`)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes. A FIFO, device or directory
    is refused without blocking (opened non-blocking, checked on the open descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise UnreadableError(exc.strerror or str(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableError(f"{file_kind(mode)}, not a regular file")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise UnreadableError(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableError(f"over {limit // 1024} KiB")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UnreadableError("not UTF-8 text") from None


class ParseError(ValueError):
    """Text that is not valid YAML or JSON, or that repeats a key; the message says where."""


def parse_yaml(text: str) -> Any:
    """YAML (JSON included) with no repeated key and no number over MAX_DIGITS digits.
    A text that starts with `{` is tried as JSON first: that needs no YAML parser (whose import
    costs a plugin start ~35 ms)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_unique_pairs, parse_int=_json_int)
        except json.JSONDecodeError:
            pass  # YAML flow style can start with `{` too: the YAML parser decides
        except (ParseError, RecursionError) as exc:
            raise ParseError(_nested(exc)) from None
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ParseError(f"{at}{exc.problem or exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ParseError(_nested(exc)) from None


def _nested(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ParseError(f"key {key!r} given twice: keep one")
        result[key] = value
    return result


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ParseError(f"a number of {len(text)} digits (at most {MAX_DIGITS})")
    return int(text)


_loader: type | None = None


def _strict_loader() -> type:
    """PyYAML's safe loader (the C one where built) refusing repeated keys and huge numbers."""
    global _loader
    if _loader is not None:
        return _loader
    import yaml
    from yaml.constructor import ConstructorError

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                if repeated:
                    raise ConstructorError(
                        None, None, f"key {key!r} given twice: keep one", key_node.start_mark
                    )
            return base.construct_mapping(self, node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            digits = str(node.value).replace("_", "").lstrip("+-")
            if len(digits) > MAX_DIGITS:
                raise ConstructorError(
                    None,
                    None,
                    f"a number of {len(digits)} digits (at most {MAX_DIGITS})",
                    node.start_mark,
                )
            return base.construct_yaml_int(self, node)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    _loader = StrictLoader
    return StrictLoader


def why_not_writable(directory: Path) -> str | None:
    """Why a file cannot be created in `directory` (None when it can, as far as we can tell)."""
    try:
        mode = directory.stat().st_mode
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(mode):
        return f"is {file_kind(mode)}, not a directory"
    if read_only:
        return "is on a read-only file system"
    if not os.access(directory, os.W_OK | os.X_OK):
        return "is not writable by this process"
    return None
