"""The token masked in what the plugin says, however a peer encoded it."""

from __future__ import annotations

import base64
import codecs
import html
import logging
import unicodedata
from urllib.parse import quote

import pytest

from plugin.core.secret import MASK, RUN, Mask, MaskedLog

TOKEN = "S3cret-token-0123456789"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "said",
    [
        f"token {TOKEN} refused",
        f"token {TOKEN.upper()} refused",
        f"echo {_b64(TOKEN)}",
        f"echo {_b64('Bearer ' + TOKEN)}",
        f"echo {_b64('Authorization: Bearer ' + TOKEN)}",
        f"echo {_b64('x' + TOKEN + 'y')}",
        f"echo {base64.urlsafe_b64encode(('??' + TOKEN).encode()).decode()}",
        f"echo {TOKEN.encode().hex()}",
        f"echo {TOKEN.encode().hex().upper()}",
        f"echo {quote(quote(TOKEN, safe=''), safe='')}",
        f"echo {''.join(f'&#{ord(c)};' for c in TOKEN)}",
        f"echo {html.escape(TOKEN).replace('-', '&#45;')}",
        "echo " + "".join(f"\\u{ord(c):04x}" for c in TOKEN),
        "echo " + "".join(f"\\x{ord(c):02x}" for c in TOKEN),
        f"echo {TOKEN[:-2]}",
        f"echo {TOKEN[5:15]}",
        f"echo {' '.join(TOKEN)}",
        "echo " + "".join(chr(ord(c) + 0xFEE0) for c in TOKEN),
        f"echo {TOKEN[::-1]}",
        f"echo {codecs.encode(TOKEN, 'rot13')}",
        f"echo {TOKEN.encode('utf-16-le').hex()}",
        f"echo {_b64('Bearer ' + TOKEN)[:-6]}",
        f"echo {_b64(TOKEN[::-1])}",
        f"echo {base64.b32encode(TOKEN.encode()).decode()}",
        f"echo {base64.b32encode(('Bearer ' + TOKEN).encode()).decode()}",
        f"echo {base64.b64encode(TOKEN.encode('utf-16-le')).decode()}",
        f"echo {TOKEN.replace('-', '')}",
        "echo " + "".join(c + "\u0301" for c in TOKEN),
        f"echo {TOKEN[::-1].replace('-', '_')}",
        f"echo {TOKEN.replace('-', '.')}",
        "echo " + "".join(f"\\{ord(c):03o}" for c in TOKEN),
        "echo " + "\\0".join(TOKEN),
        "echo " + TOKEN.encode("utf-16-le").decode("latin-1"),
        "echo " + "\u200b".join(TOKEN),
        "echo " + "\x1b[1m".join(TOKEN[i : i + 2] for i in range(0, len(TOKEN), 2)),
        "echo " + "\\x1b[1m".join(TOKEN[i : i + 2] for i in range(0, len(TOKEN), 2)),
        "echo " + str(list(TOKEN.encode())),
        "echo [" + " ".join(str(b) for b in TOKEN.encode()) + "]",
        "echo " + "".join(f"\\U{ord(c):08x}" for c in TOKEN),
        "echo []byte{" + ", ".join(f"0x{b:x}" for b in TOKEN.encode()) + "}",
    ],
    ids=["raw", "upper-case", "base64", "base64-of-bearer", "base64-of-the-header",
         "base64-offset-1", "urlsafe-base64-offset-2", "hex", "hex-upper", "percent-twice",
         "html-entities", "html-entity-dash", "json-escapes", "backslash-x", "cut-short",
         "a-middle-part", "spaced-out", "full-width", "reversed", "rot13", "utf-16-hex",
         "base64-cut-short", "base64-of-its-reverse", "base32", "base32-of-the-header",
         "base64-of-utf-16", "separators-removed", "an-accent-on-each-letter",
         "reversed-with-other-separators", "other-separators", "octal", "backslash-0-between",
         "utf-16-as-bytes", "zero-width-spaces", "ansi-every-2", "ansi-escaped-every-2",
         "python-bytes-list", "go-bytes", "backslash-U", "go-hex-bytes"],
)  # fmt: skip
def test_the_token_in_any_encoding_a_peer_may_echo_is_masked(said: str) -> None:
    masked = Mask(TOKEN)(said)

    assert MASK in masked
    assert masked.startswith(("token ", "echo "))
    assert TOKEN[:RUN].lower() not in masked.lower()
    assert _b64(TOKEN)[:12] not in masked


# a service account token's shape: a JWT, base64url
JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkZ3In0.eyJpc3MiOiJrdWJlcm5ldGVzIn0.Q2xhaW1zU2lnbmF0dXJlX3g"


@pytest.mark.parametrize("secret", [TOKEN, JWT])
@pytest.mark.parametrize(
    "said",
    [
        'pods "p%20q" is forbidden: User &quot;x&quot; cannot get resource "pods" in API group ""',
        'resourceclaims.resource.k8s.io "gpu-claim-7f9c" not found (uid '
        "f81d4fae-7dec-11d0-a765-00a0c91e6bf6, resourceVersion 48213)",
        "rdma/hca: device ID 'hca-0123' is unknown to this plugin (it has hca-0..hca-999)",
        "GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a: 503",
    ],
)
def test_a_text_without_the_token_is_kept_as_it_is(secret: str, said: str) -> None:
    assert Mask(secret)(said) == said
    assert Mask(None)(said) == said


@pytest.mark.parametrize("between", ["\x1b", "\x1b[", "\\x1b", "\x1b[1m"])
def test_a_token_with_an_escape_before_each_letter_is_masked_whole(between: str) -> None:
    """ESC c, ESC 7, ESC [ K are control sequences whose last byte is a letter: dropped with the
    sequence, the token's capitals went and what was left of it read in the output."""
    token = "Kc7Tok3nSecretQ8wzXA"

    assert Mask(token)(f"echo {between.join(token)} end") == f"echo {MASK} end"


def test_only_the_token_is_masked_the_rest_kept_as_it_came() -> None:
    """The token is found in the decoded text, but masked where it came from: a message's other
    escapes, digits and entities are not rewritten (byte lists became control characters)."""
    percent = "".join(f"%{b:02X}" for b in TOKEN.encode())
    rest = "at /srv/a%2Fb ports 1 3 5 7 9 11 13 15 &amp; \\x41"

    said = Mask(TOKEN)(f"403 for {percent} {rest} {TOKEN}\x1b[0m and {' '.join(TOKEN)}.")

    assert said == f"403 for {MASK} {rest} {MASK}\x1b[0m and {MASK}."


def test_a_short_token_is_masked_as_a_word_of_its_own_only() -> None:
    mask = Mask("t")

    assert mask("token t: users: the user 't'") == f"token {MASK}: users: the user '{MASK}'"
    assert Mask("ab")("ab and YWI and abc") == f"{MASK} and YWI and abc"


def test_several_secrets_long_and_short_are_each_masked_by_the_label_given() -> None:
    mask = Mask(TOKEN, "pw", None, JWT, label="[secret]")

    said = mask(f"env: A={TOKEN.upper()} B=pw C={JWT[::-1]} D=pwd")

    assert said == "env: A=[secret] B=[secret] C=[secret] D=pwd"


@pytest.mark.parametrize(
    "secret", ["Ünïcödé-pass-phrase-42", "密码是秘密的口令一二三", "паролькириллица", "pässw"]
)
def test_a_secret_in_any_script_is_masked_as_given_and_without_its_accents(secret: str) -> None:
    mask = Mask(secret, label="[secret]")
    spread = unicodedata.normalize("NFKD", secret)
    unaccented = "".join(c for c in spread if not unicodedata.combining(c))

    assert mask(f"said: {secret}!") == "said: [secret]!"
    assert mask(f"said: {unaccented}!") == "said: [secret]!"
    if len(secret) >= RUN:  # a short one is masked as a word of its own only
        assert mask(f"env: P={_b64(secret)}").startswith("env: P=[secret]")


@pytest.mark.parametrize(
    "secret", ["Пароль-секрет-й", "我的部署密码很长很长", "Ελληνικό-Μυστικό", "İstanbul-şifre-9"]
)
def test_a_secret_not_in_ascii_is_masked_in_any_letter_case_and_as_escaped_utf_8(
    secret: str,
) -> None:
    """Letter case was folded in ASCII only; a run of \\xXX or octal escapes was read one
    Latin-1 character a byte, not as the UTF-8 text it holds."""
    mask = Mask(secret, label="[secret]")
    raw = secret.encode()

    for said in (
        secret.upper(),
        secret.title(),
        "".join(f"\\x{b:02x}" for b in raw),
        "".join(f"\\{b:03o}" for b in raw),
        repr(raw),
    ):
        assert mask(f"env: P={said} end") == "env: P=[secret] end" or (
            said.startswith("b'") and mask(f"env: P={said} end") == "env: P=b'[secret]' end"
        ), said


def test_escaped_bytes_that_are_not_utf_8_are_read_as_before_and_the_text_kept() -> None:
    said = r"bytes \xff\xfe\x00 and \303\251t\303\251 kept"

    assert Mask(TOKEN)(said) == said


def test_a_short_secret_in_utf_16_read_as_bytes_is_masked() -> None:
    said = "raw: " + "hunt3r".encode("utf-16-le").decode("latin-1") + " end"

    assert Mask("hunt3r")(said) == f"raw: {MASK} end"


def test_a_log_record_is_masked_with_its_arguments_and_traceback() -> None:
    record = logging.LogRecord("x", logging.WARNING, "f", 1, "claim %s: %s", ("c", TOKEN), None)
    try:
        raise ValueError(f"bad {TOKEN}")
    except ValueError as exc:
        record.exc_info = (ValueError, exc, exc.__traceback__)

    assert MaskedLog(Mask(TOKEN)).filter(record)
    line = logging.Formatter().format(record)

    assert line.startswith(f"claim c: {MASK}")
    assert TOKEN not in line
    assert f"bad {MASK}" in line
