"""The secrets a process holds (the plugin its API token, deploy the stack's passphrase), masked
wherever it says a peer's words: every log line, every answer to the kubelet, every Event, every
line of the engine's output. A peer may echo a secret back (a proxy quoting the Authorization
header, a claim or pod named after it, a device ID, a CLI printing its environment), raw or
encoded, whole or cut short: each way a message can carry it is masked, not just the raw text."""

from __future__ import annotations

import base64
import codecs
import hashlib
import html
import logging
import re
import string
import sys
import unicodedata
from array import array
from bisect import bisect_left
from collections.abc import Callable
from urllib.parse import unquote

MASK = "<token>"
# A run of this many characters of the token (or of one of its encodings) is masked: a peer
# may clip a long value, and a shorter run could be ordinary text.
RUN = 8
# A text masked at most: the rest is cut (scanning 16 MiB took seconds and 100s of MiB).
TEXT_MAX = 1 << 20
# Decoding rounds at most (a proxy may percent-encode an already encoded URL).
_ROUNDS = 4
# ASCII letters in lower case, URL-safe base64's two characters as standard's: one character
# for one (str.lower makes 'İ' two, which would move every span after it)
_FOLD = str.maketrans(string.ascii_uppercase + "-_", string.ascii_lowercase + "+/")
# A run of byte escapes (\xXX, \NNN): a UTF-8 text's bytes, as C, printf and Python's bytes
# repr write a non-ASCII one
_BYTE_ESCAPES = re.compile(r"(?:\\x[0-9a-fA-F]{2}|\\[0-7]{1,3}){2,}")
# \uXXXX (JSON), \UXXXXXXXX, \xXX and \NNN (C, printf, Go's %q of bytes; \0 among them)
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})|\\x([0-9a-fA-F]{2})|\\([0-7]{1,3})")
# A terminal's control sequences (colours, cursor moves: ESC [ ... final byte; ESC ] ... BEL or
# ESC \), which a CLI may put between any two characters
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")
# Bytes written as numbers, 8 or more: decimal (Go's %v of a []byte: [112 117 ...]; a list's
# repr) or 0x hex (Go's %#v: []byte{0x70, 0x75, ...}; C's initializers)
_DECIMAL_BYTES = re.compile(r"\b[0-9]{1,3}(?:(?:, ?| )[0-9]{1,3}){7,}\b")
_HEX_BYTES = re.compile(r"\b0x[0-9a-fA-F]{1,2}(?:(?:, ?| )0x[0-9a-fA-F]{1,2}){7,}\b")


def _unescaped(match: re.Match[str]) -> str:
    hex_digits = match.group(1) or match.group(2) or match.group(3)
    code = int(hex_digits, 16) if hex_digits else int(match.group(4), 8) % 256
    return chr(code) if code <= sys.maxunicode else match.group(0)


def _utf8_escapes(match: re.Match[str]) -> str:
    """A run of byte escapes as the UTF-8 text it holds; left to _ESCAPE, one character each,
    when it is ASCII (finer spans) or not UTF-8."""
    raw = bytes(
        int(e[2:], 16) if e.startswith("\\x") else int(e[1:], 8) % 256
        for e in re.findall(r"\\x[0-9a-fA-F]{2}|\\[0-7]{1,3}", match.group(0))
    )
    if raw.isascii():
        return match.group(0)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return match.group(0)


# The bytes a text's UTF-8 or UTF-16 is made of: printable, white space, NUL
_TEXT_BYTES = frozenset((0, 9, 10, 13, *range(32, 256)))


def _as_bytes(match: re.Match[str]) -> str:
    written = match.group(0)
    if "0x" in written:
        numbers = [int(n, 16) for n in re.findall(r"0x([0-9a-fA-F]+)", written)]
    else:
        numbers = [int(n) for n in re.findall(r"[0-9]+", written)]
    if not all(n in _TEXT_BYTES for n in numbers):  # counts, ports, IDs: not a text's bytes
        return match.group(0)
    return bytes(numbers).decode("utf-8", errors="replace")


# Percent-escaped bytes (a run of them is one UTF-8 text) and HTML's character references
# (html.unescape's own pattern: numeric, or a name with or without its `;`)
_PERCENT = re.compile(r"(?:%[0-9a-fA-F]{2})+")
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


class _Decoded:
    """A text decoded, and for each of its characters the span of the original text it was
    decoded from: a secret found in it is masked in the text as it came, the rest kept as is."""

    def __init__(self, text: str, starts: list[int], ends: list[int]) -> None:
        self.text, self.starts, self.ends = text, starts, ends

    @classmethod
    def of(cls, text: str) -> _Decoded:
        return cls(text, list(range(len(text))), list(range(1, len(text) + 1)))

    def sub(self, pattern: re.Pattern[str], new: Callable[[re.Match[str]], str]) -> _Decoded:
        """Each match of `pattern` replaced by what `new` makes of it: its characters come from
        the whole match."""
        text, starts, ends = self.text, self.starts, self.ends
        pieces: list[str] = []
        new_starts: list[int] = []
        new_ends: list[int] = []
        at = 0
        for match in pattern.finditer(text):
            a, b = match.span()
            replaced = new(match)
            if replaced == match.group(0):
                continue
            pieces += [text[at:a], replaced]
            new_starts += starts[at:a] + [starts[a]] * len(replaced)
            new_ends += ends[at:a] + [ends[b - 1]] * len(replaced)
            at = b
        if not pieces:
            return self
        pieces.append(text[at:])
        return _Decoded("".join(pieces), new_starts + starts[at:], new_ends + ends[at:])

    def normalized(self) -> _Decoded:
        """In Unicode's compatibility form without combining marks, NULs and format characters
        (each character decomposed on its own: the marks it could be reordered with go)."""
        if self.text.isascii():
            return self.sub(_NUL, lambda _: "")
        chars: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        for i, c in enumerate(self.text):
            for part in unicodedata.normalize("NFKD", c):
                if _kept(part):
                    chars.append(part)
                    starts.append(self.starts[i])
                    ends.append(self.ends[i])
        spread = _Decoded("".join(chars), starts, ends)
        # composed again (Hangul jamo into a syllable): ASCII composes with nothing kept here
        return spread.sub(_NON_ASCII, lambda m: unicodedata.normalize("NFC", m.group(0)))


_NUL = re.compile("\0")


def _kept(c: str) -> bool:
    return not unicodedata.combining(c) and c != "\0" and unicodedata.category(c) != "Cf"


def _decode(text: str, controls: bool = True) -> tuple[_Decoded, bool]:
    """`text` without terminal control sequences (unless not `controls`), with byte lists read
    as text, percent-, HTML- and backslash-unescaped until it no longer changes, and in
    Unicode's compatibility form (a full-width letter is the letter), without combining marks
    (an accent put on each letter), NULs (UTF-16 read as bytes) and invisible format characters
    (a zero-width space between letters). And whether a control sequence was dropped."""
    found = _Decoded.of(text).sub(_DECIMAL_BYTES, _as_bytes).sub(_HEX_BYTES, _as_bytes)
    dropped = False
    for _ in range(_ROUNDS):  # a sequence may be escaped itself (a log line's `\x1b[1m`)
        plain = (
            found.sub(_PERCENT, lambda m: unquote(m.group(0)))
            .sub(_CHARREF, lambda m: html.unescape(m.group(0)))
            .sub(_BYTE_ESCAPES, _utf8_escapes)
            .sub(_ESCAPE, _unescaped)
        )
        if controls:
            kept = plain
            plain = plain.sub(_ANSI, lambda _: "")
            dropped = dropped or plain is not kept
        if plain.text == found.text:
            break
        found = plain
    return found.normalized(), dropped


def decoded(text: str) -> str:
    """`text` as a secret in it is looked for (see _decode)."""
    return _decode(text)[0].text


def _cores(secret: bytes, group: int, bits: int, encode: Callable[[bytes], bytes]) -> set[str]:
    """The part of an encoding (base64: 3-byte groups, 6 bits a character; base32: 5, 5) that
    the secret alone decides, at each alignment it can take in a longer encoded text ("Bearer "
    + token is one): characters touching a byte before it, or bits after it, depend on those."""
    cores: set[str] = set()
    for offset in range(group):
        encoded = encode(bytes(offset) + secret).decode().rstrip("=")
        start = (offset * 8 + bits - 1) // bits
        cores.add(encoded[start : ((len(secret) + offset) * 8) // bits])
    return cores


def _encoded(raw: bytes) -> set[str]:
    """Hex, base64 (at its 3 alignments) and base32 (at its 5) of `raw`."""
    return {raw.hex()} | _cores(raw, 3, 6, base64.b64encode) | _cores(raw, 5, 5, base64.b32encode)


def forms(secret: str) -> set[str]:
    """The texts a message may carry the secret as, once unescaped: as is, reversed, ROT13;
    hex, base64 and base32 of each, and of the secret's UTF-16 (.NET's and PowerShell's
    encoding) too."""
    reverse, rot13 = secret[::-1], codecs.encode(secret, "rot13")
    found = {secret, reverse, rot13}
    for raw in (
        secret.encode(),
        secret.encode("utf-16-le"),
        secret.encode("utf-16-be"),
        reverse.encode(),
        rot13.encode(),
    ):
        found |= _encoded(raw)
    return found


def _folded(text: str) -> str:
    """As runs are compared: in lower case (any script's letters), URL-safe base64's two
    characters as standard's; one character for one, so spans stay where they are."""
    folded = text.translate(_FOLD)
    if folded.isascii():
        return folded
    lower = folded.lower()
    if len(lower) == len(folded):
        return lower
    return "".join(low if len(low := c.lower()) == 1 else c for c in folded)  # 'İ' stays


def _as_read(secret: str) -> str:
    """A secret from the environment holding bytes that are not UTF-8 (Python's surrogate
    escapes, which no encoder takes) as a peer's output carrying those bytes reads: decoded
    with replacement."""
    try:
        raw = secret.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder made
        raw = secret.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


class Mask:
    """Any run of `RUN` characters or more of a secret, or of one of its forms, in any letter
    case, even spaced out: masked by `label`. A secret shorter than `RUN` is masked where it is
    a word of its own. No secret: texts are kept as they are."""

    def __init__(self, *secrets: str | None, label: str = MASK) -> None:
        self._label = label
        given = {_as_read(s) for s in secrets if s}
        # a short one as a word of its own: a token "t" is not every t of a message; as given
        # and as a text holding it reads once decoded (without its accents)
        short = sorted({t for s in given if len(s) < RUN for t in (s, decoded(s)) if t})
        self._short = (
            re.compile("|".join(rf"(?<!\w){re.escape(_folded(s))}(?!\w)" for s in short))
            if short
            else None
        )
        long = [s for s in given if len(s) >= RUN]
        plain = {t for s in long for t in (s, decoded(s))}
        every = set[str]().union(*(forms(s) for s in long), plain, {t[::-1] for t in plain})
        self._runs = _runs(every)
        # the characters a form is written with: anything else between them (a space, a dot
        # a proxy put there) is skipped when runs are looked for
        self._alphabet = frozenset(_folded("".join(every)))
        # and each secret and its reverse by their letters and digits alone, whatever separates
        # them (`_` for `-`)
        self._bare_runs = _runs({_bare(t) for s in plain for t in (s, s[::-1])})

    def __call__(self, text: str) -> str:
        if self._short is None and not self._runs:  # no secret
            return text
        if len(text) > TEXT_MAX:  # no message is that long: what is said of it is cut anyway
            text = f"{text[:TEXT_MAX]}… ({len(text)} characters)"
        found, dropped = _decode(text)
        places = self._places(found, text)
        if dropped:  # a sequence's last byte may have been a letter of the secret (ESC c, ESC [ K)
            places += self._places(_decode(text, controls=False)[0], text)
        merged: list[tuple[int, int]] = []
        for a, b in sorted(places):
            if merged and a <= merged[-1][1]:  # found twice, or the same run spaced out
                a, b = merged[-1][0], max(b, merged.pop()[1])
            merged.append((a, b))
        out: list[str] = []
        at = 0
        for a, b in merged:
            out += [text[at:a], self._label]
            at = b
        return "".join(out) + text[at:]

    def _places(self, found: _Decoded, text: str) -> list[tuple[int, int]]:
        """Where each secret `found` holds came from in `text`."""
        places: list[tuple[int, int]] = []
        for start, end in self._spans(found.text):
            a, b = found.starts[start], found.ends[end - 1]
            while b < len(text) and not _kept(text[b]):  # its last letter's accent, UTF-16's NUL
                b += 1
            places.append((a, b))
        return places

    def _spans(self, plain: str) -> list[tuple[int, int]]:
        """The parts of `plain` that are a secret: sorted, apart from each other."""
        low = _folded(plain)
        covered = _covered(low, self._alphabet.__contains__, self._runs) | _covered(
            low, str.isalnum, self._bare_runs
        )
        if self._short is not None:
            covered.update(i for m in self._short.finditer(low) for i in range(*m.span()))
        spans: list[tuple[int, int]] = []
        for at in sorted(covered):
            if spans and not any(c.isalnum() for c in low[spans[-1][1] : at]):
                spans[-1] = (spans[-1][0], at + 1)  # the same run, spaced out
            else:
                spans.append((at, at + 1))
        return spans


def _bare(text: str) -> str:
    return "".join(c for c in text if c.isalnum())


def _key(run: str) -> int:
    """A run of RUN folded characters as a 64-bit number: its bytes when ASCII, else a digest
    of them (a passphrase may be any text)."""
    data = run.encode()
    if len(data) > RUN:
        data = hashlib.blake2b(data, digest_size=RUN).digest()
    return int.from_bytes(data, "big")


def _runs(texts: set[str]) -> array[int]:
    """Each run of RUN characters (folded) of `texts` as a 64-bit number, sorted: 8 bytes a run
    (as a set of strings, a service account's token took 1.2 MB)."""
    return array("Q", sorted({
        _key(_folded(t[i : i + RUN])) for t in texts for i in range(len(t) - RUN + 1)
    }))  # fmt: skip


def _covered(low: str, keep: Callable[[str], bool], runs: array[int]) -> set[int]:
    """The places of `low` that are in a run of `runs`, once what `keep` refuses (what
    separates the run's characters) is skipped."""
    kept = [i for i, c in enumerate(low) if keep(c)]
    compact = "".join(low[i] for i in kept)
    covered: set[int] = set()
    for at in range(len(compact) - RUN + 1):
        key = _key(compact[at : at + RUN])
        found = bisect_left(runs, key)
        if found < len(runs) and runs[found] == key:
            covered.update(kept[at : at + RUN])
    return covered


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
