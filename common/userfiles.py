"""Files a user hands us (the plugin config, a stack file): read only when they are regular
files of bounded size, and parsed strictly, so that no such file can block a read, exhaust
memory, or have one of two values win silently."""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import os
import pwd
import re
import reprlib
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

# A ConfigMap holds at most 1 MiB: no config this project reads is legitimately larger.
MAX_FILE_BYTES = 1 << 20
# int64 has 19 digits: a longer number is a slip (and Python refuses to parse 4300 digits).
MAX_DIGITS = 20

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


# A file's values expanded: what a 1 MiB file of plain values holds at most. YAML aliases can
# name a value many times over (`b: [*a, *a, ...]`), so a small file can expand past any memory.
MAX_VALUES = 1_000_000

_DECIMAL = re.compile(r"[0-9]+")


class UnreadableError(ValueError):
    """A file that is not read: the message says why (`a FIFO, not a regular file`);
    `missing` when there is no file at all."""

    def __init__(self, why: str, *, missing: bool = False) -> None:
        super().__init__(why)
        self.missing = missing


def decimal(text: str) -> int | None:
    """`text` as a whole number written in ASCII digits (str.isdigit also takes '²' and '٩'),
    of at most MAX_DIGITS digits; else None."""
    if len(text) > MAX_DIGITS or not _DECIMAL.fullmatch(text):
        return None
    return int(text)


_quote = reprlib.Repr()
_quote.maxstring = _quote.maxother = 80
_quote.maxlist = _quote.maxtuple = _quote.maxdict = _quote.maxset = 6


def described(value: object) -> str:
    """What a refused value is, without quoting it: a value in the wrong place may be a secret
    (a password typed into another key, a token file given as a config)."""
    if isinstance(value, str):
        if not value:
            return "empty text"
        return f"text of {len(value)} character{'s' if len(value) > 1 else ''}"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "nothing"}[value]
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return f"a list of {len(cast(list[object], value))}"
    if isinstance(value, dict):
        return f"a mapping of {len(cast(dict[object, object], value))} keys"
    return type(value).__name__


def shown(value: object) -> str:
    """A value quoted back in a message, cut short (a slip can be megabytes, or a huge list)."""
    text = _quote.repr(value)
    if isinstance(value, str) and len(value) > _quote.maxstring:
        text += f" ({len(value)} characters)"
    return text


def file_kind(mode: int) -> str:
    """What a stat mode names, as a user would say it (`a FIFO`, `a regular file`)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes. A FIFO, device or directory
    is refused without blocking (opened non-blocking, checked on the open descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        try:  # a socket cannot be opened at all: name what it is, not open(2)'s ENXIO
            mode = os.stat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise UnreadableError(f"{file_kind(mode)}, not a regular file") from None
        missing = exc.errno == errno.ENOENT
        raise UnreadableError(exc.strerror or str(exc), missing=missing) from None
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


# What YAML's messages quote from the text (a tag, an alias, an anchor), and what they quote
# of their own (a token: '<scalar>', a ':').
_QUOTED = re.compile(r"'([^'\s<][^'\s]+)'")


def _unquoted(message: str) -> str:
    """A parser's message with the file's text it quotes described: it may be a secret."""
    return _QUOTED.sub(lambda m: f"({described(m.group(1))})", message)


def parse_yaml(text: str) -> Any:
    """YAML (JSON included) with no repeated key and no number over MAX_DIGITS digits. A text
    that starts with `{` is tried as JSON first: that needs no YAML parser (whose import costs a
    plugin start ~35 ms)."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_unique_pairs, parse_int=_json_int)
        except json.JSONDecodeError:
            pass  # YAML flow style can start with `{` too: the YAML parser decides
        except (ParseError, RecursionError) as exc:
            raise ParseError(_nested(exc)) from None
    import yaml

    loader = _strict_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded_size(node, {})
        if values > MAX_VALUES:
            raise ParseError(
                f"its aliases expand to {values} values (at most {MAX_VALUES}): write the "
                "values out instead of repeating aliases"
            )
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        # "expected a single document in the stream, but found another document"
        said = ", ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
        if (
            mark
            and text.splitlines()[mark.line : mark.line + 1]
            and "\t" in (text.splitlines()[mark.line][: mark.column + 1])
        ):  # YAML's "found character '\t' that cannot start any token"
            said += ": YAML indents with spaces, not tabs"
        raise ParseError(f"{at}{_unquoted(said)}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, e.g. NUL
        char: object = exc.character
        code = char if isinstance(char, int) else ord(str(char)[:1] or "\0")
        raise ParseError(
            f"character #x{code:04x} at position {exc.position} is not allowed in YAML"
        ) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ParseError(_nested(exc)) from None
    finally:
        loader.dispose()


def _expanded_size(node: Any, seen: dict[int, int]) -> int:
    """How many values `node` stands for once every alias is expanded (aliases share nodes:
    each node is counted once, then multiplied where it is named again)."""
    if id(node) in seen:
        return seen[id(node)]
    size = 1
    value: object = node.value
    if isinstance(value, list):
        for item in cast(list[Any], value):  # mapping nodes hold (key, value) pairs
            pair = cast(tuple[Any, ...], item if isinstance(item, tuple) else (item,))
            size += sum(_expanded_size(child, seen) for child in pair)
    seen[id(node)] = size
    return size


def _nested(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _twice(key: object) -> str:
    return f"{key_shown(key)} given twice: keep one"


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ParseError(_twice(key))
        result[key] = value
    return result


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ParseError(f"a number of {len(text)} digits (at most {MAX_DIGITS})")
    return int(text)


_loader: type | None = None
_BOOL, _INT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int"


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
                        None,
                        None,
                        _twice(key),
                        key_node.start_mark,
                    )
            return base.construct_mapping(self, node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            text = str(node.value)
            digits = text.lstrip("+-").removeprefix("0o").removeprefix("0x")
            if len(digits) > MAX_DIGITS:
                raise ConstructorError(
                    None,
                    None,
                    f"a number of {len(digits)} digits (at most {MAX_DIGITS})",
                    node.start_mark,
                )
            sign = -1 if text.startswith("-") else 1
            for prefix, radix in (("0o", 8), ("0x", 16)):
                if text.lstrip("+-").startswith(prefix):
                    return sign * int(digits, radix)
            return int(text, 10)  # 017 is 17, as YAML 1.2 reads it (1.1 read 15)

    # YAML 1.2's core schema, as the Pulumi CLI and Kubernetes read these files: only
    # true/false are booleans (1.1 also took yes, on, y), and integers are decimal, 0o or 0x
    # (1.1 also took 0b, leading-zero octal and 1:30 as 90).
    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in found if tag not in (_BOOL, _INT)]
        for first, found in base.yaml_implicit_resolvers.items()
    }
    StrictLoader.add_implicit_resolver(
        _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    StrictLoader.add_implicit_resolver(
        _INT,
        re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
        list("-+0123456789"),
    )
    StrictLoader.add_constructor(_INT, StrictLoader.construct_yaml_int)
    _loader = StrictLoader
    return StrictLoader


def user_name(uid: int) -> str:
    """A user as `ls -l` names one: by name, else by number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"user {uid}"


def on_read_only_fs(path: Path) -> bool:
    """Whether `path` is on a read-only file system (access() says only EROFS: no chmod helps)."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def why_not_writable(directory: Path) -> str | None:
    """Why a file cannot be created in `directory` (None when one was just created there)."""
    try:
        mode = directory.stat().st_mode
        read_only = on_read_only_fs(directory)
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
    try:  # the only sure answer (root passes access(); /proc, sysfs refuse new files anyway)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as exc:
        return f"refuses a new file ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(tmp)
    return None


def why_not_made(directory: Path, exc: OSError) -> str:
    """What a failed mkdir of `directory` met, said as what is there (mkdir says only "File
    exists" of a symlink loop or a link to nothing)."""
    if os.path.islink(directory) and not os.path.exists(directory):
        return "is a symbolic link to nothing (or a loop): name a directory"
    there = os.path.lexists(directory) and why_not_writable(directory)
    return there or f"cannot be made ({exc.strerror or exc})"


def write_atomically(path: Path, text: str) -> None:
    """`path` holds `text` whole, or is left as it was, durably once this returns (the file and
    its directory synced: a crash or a reboot after it keeps it); only a regular file (or none)
    is replaced, keeping its permissions (a file made 0600 stays so), else 0644: a device, FIFO,
    symlink or directory there is refused, never overwritten."""
    tmp = staged(path, text)
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    sync_dir(path.parent)


def sync_dir(directory: Path) -> None:
    """The names made or removed in `directory` are on disk once this returns."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What `staged` names a file it makes beside `path`: `.<path's name>.tmp-<random>`. A process
# killed while writing leaves one behind; whoever owns `path`'s name may remove it.
TEMP_MARK = ".tmp-"


def temp_of(name: str, temp: str) -> bool:
    """Whether `temp` is a file `staged` made for a file called `name`."""
    return temp.startswith(f".{name[:_TEMP_NAME_MAX]}{TEMP_MARK}")


def remove_temps(directory: Path, ours: Callable[[str], bool]) -> None:
    """Remove the temp files in `directory` that `ours` names: left by a write that was killed
    midway (the caller is their files' only writer)."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if ours(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


# Room in a 255-byte name for the dot, the mark and mkstemp's 8 random characters.
_TEMP_NAME_MAX = 255 - 1 - len(TEMP_MARK) - 8


def staged(path: Path, text: str) -> str:
    """A new file beside `path` holding `text` whole on disk, with the permissions `path` would
    keep (see write_atomically), for the caller to rename onto it (or remove)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG | 0o644
    if not stat.S_ISREG(mode):
        raise OSError(
            errno.EEXIST, f"is {file_kind(mode)}, not a regular file: name a file to write"
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:_TEMP_NAME_MAX]}{TEMP_MARK}", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # whole on disk before it has the name (a crash, a reboot)
        os.chmod(tmp, stat.S_IMODE(mode))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


# How a key is shown bare in a message: what a config key is made of.
_BARE_KEY = re.compile(r"[A-Za-z0-9_.:/-]{1,80}")


def key_shown(key: object) -> str:
    """A key as a refusal names it: a key name is no secret, and naming it is what lets its
    author find it. Bare when plain; quoted (escapes made visible, cut short) when not."""
    if isinstance(key, str) and _BARE_KEY.fullmatch(key):
        return key
    return shown(key)


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key `key` most likely meant: a misspelling in any letter case, or one cut
    short (maxAlloc for rdmaMaxAllocations, poolMode for rdmaPoolMode)."""
    folded = {k.casefold(): k for k in known}
    typed = key.casefold()
    close = difflib.get_close_matches(typed, list(folded), n=1, cutoff=0.75)
    if not close and len(typed) >= 4:
        close = sorted((k for k in folded if typed in k), key=len)
    return folded[close[0]] if close else None


def unknown_key(key: object, known: Iterable[str]) -> str:
    """The fix for a key `known` does not hold: the nearest known key, when one is near."""
    if isinstance(key, str) and key.lstrip().startswith(("/*", "//")):
        return "JSON has no comments: remove it, or use YAML's #"
    near = nearest_key(key, known) if isinstance(key, str) else None
    return f"did you mean {near}?" if near else "remove it or fix its spelling"
