"""The one secret the plugin holds, its API token, masked wherever it may say a peer's words:
every log line, every answer to the kubelet, every Event. A peer may echo the token back (a proxy
quoting the Authorization header, a claim or pod named after it), raw or encoded: each way a
message here can carry it is masked, not just the raw text."""

from __future__ import annotations

import base64
import html
import logging
import re
from urllib.parse import unquote

MASK = "<token>"
# An encoded form shorter than this is not masked: it would match ordinary words.
_FORM_MIN = 6
# Decoding rounds at most (a proxy may percent-encode an already encoded URL).
_ROUNDS = 4
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")


def _unescaped(match: re.Match[str]) -> str:
    return chr(int(match.group(1) or match.group(2), 16))


def decoded(text: str) -> str:
    """`text` percent-, HTML- and backslash-unescaped until it no longer changes."""
    for _ in range(_ROUNDS):
        plain = _ESCAPE.sub(_unescaped, html.unescape(unquote(text)))
        if plain == text:
            break
        text = plain
    return text


def _base64_forms(secret: bytes) -> set[str]:
    """The part of its base64 that the secret alone decides, at each of the three alignments
    it can take in a longer encoded text ("Bearer " + token is one), standard and URL-safe."""
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + secret).decode().rstrip("=")
        # chars touching the prefix's bytes, or bits after the secret's end, depend on the rest
        start = (offset * 8 + 5) // 6
        end = len(secret) + offset
        core = encoded[start : (end * 8) // 6]
        forms |= {core, core.replace("+", "-").replace("/", "_")}
    return forms


class Mask:
    """The token in any text: raw, percent-, HTML- or backslash-escaped, as base64 (in any
    alignment, standard or URL-safe) or hex. No token: texts are kept as they are."""

    def __init__(self, secret: str | None) -> None:
        forms: set[str] = set()
        if secret:
            raw = secret.encode()
            forms = {secret, raw.hex()} | _base64_forms(raw)
        kept = sorted((f for f in forms if f == secret or len(f) >= _FORM_MIN), key=len)
        self._forms = (
            re.compile("|".join(re.escape(f) for f in reversed(kept)), re.IGNORECASE)
            if kept
            else None
        )

    def __call__(self, text: str) -> str:
        if self._forms is None:
            return text
        plain = decoded(text)
        if not self._forms.search(plain):
            return text
        return self._forms.sub(MASK, plain)


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


def mask_log(mask: Mask) -> None:
    """Every handler of the root log masks the token from now on."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(MaskedLog(mask))
