"""The token masked in what the plugin says, as docs/security.md's threat model says a peer
realistically echoes it: as it is or cut short, escaped by the format carrying it, or base64."""

from __future__ import annotations

import base64
import html
import logging
from urllib.parse import quote

import pytest

from common.secret import MASK, RUN, Mask, MaskedLog

TOKEN = "S3cret-token-0123456789"
# a service account token's shape: a JWT, base64url
JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkZ3In0.eyJpc3MiOiJrdWJlcm5ldGVzIn0.Q2xhaW1zU2lnbmF0dXJlX3g"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "said",
    [
        f"token {TOKEN} refused",
        f"echo {TOKEN[:-2]}",
        f"echo {TOKEN[5:15]}",
        f"echo {quote(TOKEN, safe='')}",
        f"echo {quote(quote(TOKEN, safe=''), safe='')}",
        f"echo {''.join(f'&#{ord(c)};' for c in TOKEN)}",
        f"echo {html.escape(TOKEN).replace('-', '&#45;')}",
        "echo " + "".join(f"\\u{ord(c):04x}" for c in TOKEN),
        "echo " + "".join(f"\\x{ord(c):02x}" for c in TOKEN),
        f"echo {_b64(TOKEN)}",
        f"echo {_b64('Bearer ' + TOKEN)}",
        f"echo {_b64('Authorization: Bearer ' + TOKEN)}",
        f"echo {_b64('Bearer ' + TOKEN)[:-6]}",
    ],
    ids=["raw", "cut-short", "a-middle-part", "percent", "percent-twice", "html-entities",
         "html-entity-dash", "json-escapes", "c-escapes", "base64", "base64-of-bearer",
         "base64-of-the-header", "base64-cut-short"],
)  # fmt: skip
def test_the_token_as_a_peer_echoes_it_is_masked(said: str) -> None:
    masked = Mask(TOKEN)(said)

    assert MASK in masked
    assert masked.startswith(("token ", "echo "))
    assert TOKEN[:RUN] not in masked
    assert _b64(TOKEN)[:12] not in masked


@pytest.mark.parametrize(
    "said",
    [TOKEN[::-1], TOKEN.encode().hex(), base64.b32encode(TOKEN.encode()).decode(), " ".join(TOKEN)],
    ids=["reversed", "hex", "base32", "spaced-out"],
)  # fmt: skip
def test_forms_no_realistic_peer_makes_are_out_of_scope_and_left_as_they_are(said: str) -> None:
    """docs/security.md says why: no header or environment variable comes back so."""
    assert Mask(TOKEN)(f"echo {said}") == f"echo {said}"


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


def test_only_the_token_is_masked_the_rest_kept_as_it_came() -> None:
    """The token is found in the unescaped text, but masked where it came from: a message's
    other escapes, digits and entities are not rewritten."""
    percent = "".join(f"%{b:02X}" for b in TOKEN.encode())
    rest = "at /srv/a%2Fb ports 1 3 5 7 9 11 13 15 &amp; \\x41"

    said = Mask(TOKEN)(f"403 for {percent} {rest} {TOKEN}\x1b[0m.")

    assert said == f"403 for {MASK} {rest} {MASK}\x1b[0m."


def test_a_short_secret_is_masked_as_a_word_of_its_own_only() -> None:
    mask = Mask("t")

    assert mask("token t: users: the user 't'") == f"token {MASK}: users: the user '{MASK}'"
    assert Mask("ab")("ab and YWI and abc") == f"{MASK} and YWI and abc"


def test_several_secrets_long_and_short_are_each_masked_by_the_label_given() -> None:
    mask = Mask(TOKEN, "pw", None, JWT, label="[secret]")

    said = mask(f"env: A={TOKEN} B=pw C={JWT} D=pwd E={quote(TOKEN)}")

    assert said == "env: A=[secret] B=[secret] C=[secret] D=pwd E=[secret]"


@pytest.mark.parametrize("secret", ["Ünïcödé-pass-phrase-42", "密码是秘密的口令一二三", "pässw"])
def test_a_secret_in_any_script_is_masked_as_given_and_escaped(secret: str) -> None:
    mask = Mask(secret, label="[secret]")

    assert mask(f"said: {secret}!") == "said: [secret]!"
    assert mask(f"said: {quote(secret)}!") == "said: [secret]!"
    if len(secret) >= RUN:  # a short one is masked as a word of its own only
        assert mask(f"env: P={_b64(secret)}").startswith("env: P=[secret]")


def test_a_secret_of_bytes_that_are_not_utf_8_is_masked_as_a_peer_reads_it() -> None:
    """A passphrase set in a Latin-1 shell: Python holds its bytes as surrogate escapes."""
    secret = b"caf\xe9-passphrase".decode("utf-8", "surrogateescape")

    said = Mask(secret, label="[secret]")("env: P=caf\ufffd-passphrase end")

    assert said == "env: P=[secret] end"


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
