"""Credentials in stack config: a value that may hold one is refused in plain text (it must be
stored with `pulumi config set --secret`). What a plain kubeconfig may hold is listed, not
what it may not: a field this list does not know could be a credential, so it needs --secret."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Set
from typing import Any, cast
from urllib.parse import urlsplit

from common.userfiles import ParseError, parse_yaml

# What stands for a secret's value where it cannot be shown (a render, plan.md): also what
# the offline render hands the program for a value only the Pulumi CLI can decrypt.
SECRET = "[secret]"
# Keys whose every value is a credential.
SECRET_KEYS = ("registryPassword",)
# The kubeconfig: a credential unless everything in it is on these lists.
KUBECONFIG = "kubeconfig"
CREDENTIAL_KEYS = (*SECRET_KEYS, KUBECONFIG)

_TOP = {"apiVersion", "kind", "clusters", "users", "contexts", "current-context", "preferences"}
_NAMED = {
    # list key -> (entry key, fields that hold no secret)
    "clusters": (
        "cluster",
        {
            "server",
            "certificate-authority",
            "certificate-authority-data",  # a CA certificate is public
            "insecure-skip-tls-verify",
            "tls-server-name",
            "proxy-url",
            "disable-compression",
        },
    ),
    # files named by path, and identities: no secret inline
    "users": (
        "user",
        {
            "client-certificate",
            "client-certificate-data",  # the certificate, not its key
            "client-key",
            "tokenFile",
            "username",
            "as",
            "as-uid",
            "as-groups",
        },
    ),
    "contexts": ("context", {"cluster", "user", "namespace"}),
}
_URLS = {"server", "proxy-url"}
# Inline certificates: safe only when they are certificates and nothing else (a bundle pasted
# there can carry the private key too).
_CERTIFICATES = {"certificate-authority-data", "client-certificate-data"}
_PEM_CERTIFICATES = re.compile(
    r"\s*(-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----\s*)+"
)
# Fields named in a message when they hold what may be a credential. Any other key is not
# quoted: a mistyped line (`{token:abc}` is one key) can make a secret a key.
_NAMEABLE = (
    _TOP
    | {name for _, fields in _NAMED.values() for name in fields}
    | {"name", "cluster", "user", "context", "token", "client-key-data", "password"}
    | {"auth-provider", "exec", "as-user-extra", "extensions"}
)


def plaintext_problems(raw: Mapping[str, str], secret: Set[str]) -> list[tuple[str, str]]:
    """(key, why) for each credential-bearing key stored in plain text. `why` names where the
    credential may be, never its value."""
    problems = [(k, "stored in plain text") for k in SECRET_KEYS if k in raw and k not in secret]
    kubeconfig = raw.get(KUBECONFIG)
    if kubeconfig is not None and KUBECONFIG not in secret:
        where = kubeconfig_credential(kubeconfig)
        if where is not None:
            problems.append((KUBECONFIG, f"holds what may be a credential ({where}) in plain text"))
    return problems


def kubeconfig_credential(text: str) -> str | None:
    """Where in a kubeconfig a credential may be (`users[0].user.token`), or None when every
    field is one known to hold none."""
    try:
        doc: Any = parse_yaml(text)
    except ParseError:
        return "it is not YAML, so it cannot be checked"
    if not isinstance(doc, dict):
        return "it is not a mapping, so it cannot be checked"
    top = cast(dict[str, Any], doc)
    for key, value in top.items():
        if key not in _TOP:
            return _named(key)
        if key == "preferences" and value not in (None, {}):
            return "preferences"
        if key in _NAMED and value is not None:
            where = _entries(key, value)
            if where is not None:
                return where
    return None


def _entries(key: str, value: object) -> str | None:
    entry_key, allowed = _NAMED[key]
    if not isinstance(value, list):
        return key
    for i, item in enumerate(cast(list[object], value)):
        if not isinstance(item, dict):
            return f"{key}[{i}]"
        entry = cast(dict[str, object], item)
        for name in entry:
            if name not in ("name", entry_key):
                return f"{key}[{i}].{_named(name)}"
        fields: object = entry.get(entry_key) or {}
        if not isinstance(fields, dict):
            return f"{key}[{i}].{entry_key}"
        for field, v in cast(dict[object, object], fields).items():
            if field not in allowed:
                return f"{key}[{i}].{entry_key}.{_named(field)}"
            if field in _URLS and _url_may_hold_credential(v):
                return f"{key}[{i}].{entry_key}.{field} (a login, query or fragment in the URL)"
            if field in _CERTIFICATES and not _only_certificates(v):
                return f"{key}[{i}].{entry_key}.{field} (not PEM certificates alone)"
    return None


def _named(key: object) -> str:
    return key if isinstance(key, str) and key in _NAMEABLE else "a field not known to be safe"


def _url_may_hold_credential(url: object) -> bool:
    """A login, a query (`?access_token=`) or a fragment: a URL with none is only an address."""
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:
        return True
    # `user:pass@host` without a scheme parses as a scheme and a path: any '@' is a login
    return parts is None or "@" in str(url) or bool(parts.query or parts.fragment)


def _only_certificates(data: object) -> bool:
    """Base64 of PEM certificates and nothing else: no private key, no other block."""
    try:
        pem = base64.b64decode(data, validate=True).decode("ascii") if isinstance(data, str) else ""
    except (ValueError, UnicodeDecodeError):
        return False
    if _PEM_CERTIFICATES.fullmatch(pem) is None:
        return False
    return all(_is_certificate(b) for b in re.findall(r"CERTIFICATE-----([^-]+)-----END", pem))


def _is_certificate(body: str) -> bool:
    """A block whose DER is an X.509 certificate's shape, a SEQUENCE whose first element is a
    SEQUENCE (the signed part): a private key's is an INTEGER (its version), whatever label
    it is given."""
    try:
        der = base64.b64decode("".join(body.split()), validate=True)
    except ValueError:
        return False
    if len(der) < 4 or der[0] != 0x30:
        return False
    header = 2 + (der[1] & 0x7F if der[1] & 0x80 else 0)
    return len(der) > header and der[header] == 0x30


def kubeconfig_problem(text: str) -> str | None:
    """Why `text` cannot be a kubeconfig, never quoting it (it holds credentials)."""
    if text == SECRET:  # encrypted in the stack file: the Pulumi CLI checks it when it decrypts
        return None
    try:
        doc: Any = parse_yaml(text)
    except ParseError:
        return "not YAML"
    clusters = cast(dict[str, Any], doc).get("clusters") if isinstance(doc, dict) else None
    if not isinstance(clusters, list) or not clusters:
        return "not a kubeconfig: no list of clusters"
    return None
