"""The secrets a process holds (the node agent its API token, deploy the stack's passphrase and
credentials), masked wherever it says a peer's words: every log line, every answer to the
kubelet, every Event, every line of the engine's output. What is masked follows the threat
model in docs/security.md: a secret as a peer realistically echoes it back (an error quoting a
header or the environment), whole or cut short, as it is, escaped by the format carrying it
(percent, HTML, JSON or C escapes), or in base64 (as an Authorization header is encoded)."""

from __future__ import annotations

import base64
import logging
import re
import sys
from collections.abc import Callable
from urllib.parse import unquote

MASK = "<token>"
# A run of this many characters of the secret (or of its base64) is masked: a peer may clip a
# long value, and a shorter run could be ordinary text.
RUN = 8
# A text masked at most: the rest is cut (no message is that long).
TEXT_MAX = 1 << 20
# Unescaping rounds at most (a proxy may percent-encode an already encoded URL).
_ROUNDS = 3
# Percent-escaped bytes (a run of them is one UTF-8 text); HTML's character references;
# \uXXXX (JSON), \UXXXXXXXX, \xXX (C)
_PERCENT = re.compile(r"(?:%[0-9a-fA-F]{2})+")
_CHARREF = re.compile(r"&(?:#([0-9]{1,7});?|#[xX]([0-9a-fA-F]{1,6});?|(amp|lt|gt|quot|apos);)")
# The named references an error page escapes text with (what html.escape writes); a secret's
# other characters come back as numeric ones. html.unescape's table of 2231 names costs a node
# agent 0.46 MiB of RSS for names no escaper writes.
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})|\\x([0-9a-fA-F]{2})")


def _referenced(match: re.Match[str]) -> str:
    decimal, hexadecimal, name = match.groups()
    if name:
        return _NAMED[name]
    code = int(decimal) if decimal else int(hexadecimal, 16)
    return chr(code) if 0 < code <= sys.maxunicode else match.group(0)


def _unescaped(match: re.Match[str]) -> str:
    code = int(match.group(1) or match.group(2) or match.group(3), 16)
    return chr(code) if code <= sys.maxunicode else match.group(0)


class _Decoded:
    """A text unescaped, and for each of its characters the span of the original text it came
    from: a secret found in it is masked in the text as it came, the rest kept as is."""

    def __init__(self, text: str, starts: list[int], ends: list[int]) -> None:
        self.text, self.starts, self.ends = text, starts, ends

    @classmethod
    def of(cls, text: str) -> _Decoded:
        return cls(text, list(range(len(text))), list(range(1, len(text) + 1)))

    def sub(self, pattern: re.Pattern[str], new: Callable[[re.Match[str]], str]) -> _Decoded:
        """Each match of `pattern` replaced by what `new` makes of it: its characters come from
        the whole match."""
        pieces: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        at = 0
        for match in pattern.finditer(self.text):
            a, b = match.span()
            replaced = new(match)
            if replaced == match.group(0):
                continue
            pieces += [self.text[at:a], replaced]
            starts += self.starts[at:a] + [self.starts[a]] * len(replaced)
            ends += self.ends[at:a] + [self.ends[b - 1]] * len(replaced)
            at = b
        if not pieces:
            return self
        pieces.append(self.text[at:])
        return _Decoded("".join(pieces), starts + self.starts[at:], ends + self.ends[at:])


def _unescape(text: str) -> _Decoded:
    found = _Decoded.of(text)
    for _ in range(_ROUNDS):
        plain = (
            found.sub(_PERCENT, lambda m: unquote(m.group(0)))
            .sub(_CHARREF, _referenced)
            .sub(_ESCAPE, _unescaped)
        )
        if plain is found:
            break
        found = plain
    return found


def _base64(secret: bytes) -> set[str]:
    """The part of the secret's base64 that it alone decides, at each of the 3 alignments it
    can take in a longer encoded text (`Bearer <token>` encoded whole)."""
    cores: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + secret).decode().rstrip("=")
        cores.add(encoded[(offset * 8 + 5) // 6 : ((len(secret) + offset) * 8) // 6])
    return cores


def _as_read(secret: str) -> str:
    """A secret from the environment holding bytes that are not UTF-8 (Python's surrogate
    escapes) as a peer's output carrying those bytes reads: decoded with replacement."""
    raw = secret.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


class Mask:
    """Any run of `RUN` characters or more of a secret, or of its base64, in a text as it comes
    or unescaped: masked by `label`. A secret shorter than `RUN` is masked where it is a word of
    its own. No secret: texts are kept as they are."""

    def __init__(self, *secrets: str | None, label: str = MASK) -> None:
        self._label = label
        given = {_as_read(s) for s in secrets if s}
        short = sorted(s for s in given if len(s) < RUN)
        self._short = (
            re.compile("|".join(rf"(?<!\w){re.escape(s)}(?!\w)" for s in short)) if short else None
        )
        forms = {f for s in given if len(s) >= RUN for f in (s, *_base64(s.encode()))}
        self._runs = {f[i : i + RUN] for f in forms for i in range(len(f) - RUN + 1)}

    def __call__(self, text: str) -> str:
        if self._short is None and not self._runs:  # no secret
            return text
        if len(text) > TEXT_MAX:
            text = f"{text[:TEXT_MAX]}… ({len(text)} characters)"
        places = self._places(_Decoded.of(text))
        if any(c in text for c in "%&\\"):
            places += self._places(_unescape(text))
        merged: list[tuple[int, int]] = []
        for a, b in sorted(places):
            if merged and a <= merged[-1][1]:  # found twice, or in runs that overlap
                a, b = merged[-1][0], max(b, merged.pop()[1])
            merged.append((a, b))
        out: list[str] = []
        at = 0
        for a, b in merged:
            out += [text[at:a], self._label]
            at = b
        return "".join(out) + text[at:]

    def _places(self, found: _Decoded) -> list[tuple[int, int]]:
        """Where, in the original text, each run of a secret that `found` holds came from."""
        plain = found.text
        spans = [
            (i, i + RUN) for i in range(len(plain) - RUN + 1) if plain[i : i + RUN] in self._runs
        ]
        if self._short is not None:
            spans += [m.span() for m in self._short.finditer(plain)]
        return [(found.starts[a], found.ends[b - 1]) for a, b in spans]


class MaskedLog(logging.Filter):
    """Installed on the log's handlers: each record is formatted once and masked."""

    def __init__(self, mask: Mask) -> None:
        super().__init__()
        self.mask = mask

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self.mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            record.exc_text = self.mask(logging.Formatter().formatException(record.exc_info))
        return True


_held = Mask()


def hold(mask: Mask) -> None:
    """The process's secrets from now on (set at start by a front end, again when its token is
    rotated): masked in every handler of its log and by `masked`."""
    global _held
    _held = mask
    for handler in logging.getLogger().handlers:
        held = [f for f in handler.filters if isinstance(f, MaskedLog)]
        for log in held:
            log.mask = mask
        if not held:
            handler.addFilter(MaskedLog(mask))


def masked(text: str) -> str:
    """`text` with the process's secrets masked: for what is said to a peer (the kubelet's
    answers, Events) or relayed from one (the engine's output)."""
    return _held(text)
