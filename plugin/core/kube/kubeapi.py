"""The few Kubernetes API calls the DRA driver makes (ResourceSlices, ResourceClaims), over
HTTPS with the standard library: a client library would cost more memory than the driver's
whole core. Credentials come from a kubeconfig (run outside a pod) or from the pod's service
account. Blocking: the driver calls it from a thread."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import http.client
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlencode, urlsplit

from common.secret import Mask, hold
from common.terminal import host_port, one_line
from common.userfiles import (
    ParseError,
    UnreadableError,
    described,
    parse_yaml,
    read_text,
    shown,
)

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TIMEOUT = 15.0  # each connect and read
_DEADLINE = 30.0  # a whole answer
_SLOW = 5.0  # an answer still coming after this long is said while it is read
# An answer's body at most: a node's ResourceSlices or an Event are kilobytes.
_BODY_MAX = 16 << 20
# A token file's size at most (a service account's JWT is about 1 KB).
_TOKEN_MAX = 64 * 1024
# A PEM file's size at most (a CA bundle of hundreds of certificates is under 1 MiB).
_PEM_MAX = 1 << 20
# A bearer token, or a server URL: visible ASCII (RFC 6750's b64token and more), as a header
# carries it.
_TOKEN = re.compile(r"[\x21-\x7e]+")
# A DNS name's label, as a host name has it.
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


# OpenSSL's verify codes of a certificate that does not name the host or address dialled
_NAME_MISMATCH = (62, 64)


class KubeApiError(RuntimeError):
    """A call the API server refused or could not be made; `status` is the HTTP code (0: none).
    `said`: the client has logged it at ERROR already (a fault only a person mends, said once,
    not at each retry): a caller logs it at debug."""

    def __init__(self, message: str, status: int = 0, *, said: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.said = said


@dataclass
class _Said:
    """The faults only a person mends (a certificate not trusted, a credential not taken) said
    at ERROR: each once, until a call succeeds again."""

    faults: set[str] = field(default_factory=set[str])

    def once(self, fault: str, message: str, status: int = 0) -> KubeApiError:
        if fault not in self.faults:
            self.faults.add(fault)
            logger.error("%s; retrying quietly until it is mended", message)
        return KubeApiError(message, status, said=True)


# Ways to log in that this client does not take (kubectl runs a plugin for exec and
# auth-provider; basic auth is gone from Kubernetes), and impersonation (dropped, every call
# would be made as someone else than the kubeconfig says).
_UNSUPPORTED = ("exec", "auth-provider", "username", "password", "as", "as-groups", "as-uid")


async def in_background(call: Callable[[], T]) -> T:
    """`call()` (an API call) in a daemon thread: a stop never waits for one in flight, up to
    its timeout, saying nothing; what it would have done is dropped with the process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))

    def run() -> None:
        try:
            result, error = call(), None
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="kubeapi", daemon=True).start()
    return await done


class CredentialsError(ValueError):
    """No usable credentials: the message names the file or field and the fix."""


T = TypeVar("T")


_FIX = "fix it in the kubeconfig"


def _field(
    where: str, field: str, read: Callable[[], T], file: str | None = None, fix: str = _FIX
) -> T:
    """`read()` of one credential field, or CredentialsError naming the field (and `file`, the
    path it names) and why; never its value (a key, a token)."""
    try:
        return read()
    except UnreadableError as exc:
        why = f"{file}: {exc}" if file else str(exc)
    except (binascii.Error, UnicodeDecodeError):
        why = "not base64 of PEM text"
    except ssl.SSLError as exc:
        why = f"not what TLS can use ({exc.reason or 'bad PEM'})"
    except OSError as exc:
        named = exc.filename or file
        why = f"{named}: {exc.strerror or exc}" if named else str(exc.strerror or exc)
    except (ValueError, TypeError) as exc:
        why = str(exc)
    raise CredentialsError(f"{where}: {field}: {why}: {fix}")


class TokenFile:
    """A token kept in a file that is rewritten under a running process (the kubelet rotates a
    pod's projected service-account token; a kubeconfig's tokenFile): read again when the file
    changes, as client-go does, so calls go on with the new token and the mask covers it."""

    def __init__(self, path: Path, token: str) -> None:
        self.path, self.token = path, token
        self._seen = self._stamp()
        self._lock = threading.Lock()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:  # through the symlink the kubelet swaps (..data)
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> str:
        """The token now: the file's, if it changed and holds one, else the last read."""
        stamp = self._stamp()
        with self._lock:
            if stamp is None or stamp == self._seen:
                return self.token
            self._seen = stamp
            try:
                token = read_text(self.path, _TOKEN_MAX).strip()
            except UnreadableError as exc:
                logger.warning("tokenFile %s cannot be read (%s): the last token is used",
                               self.path, exc)  # fmt: skip
                return self.token
            if not _TOKEN.fullmatch(token):  # a file being written, or not a token
                logger.warning("tokenFile %s holds %s, not a token: the last token is used",
                               self.path, described(token))  # fmt: skip
                return self.token
            if token != self.token:
                hold(Mask(token, self.token))  # the old one may still be echoed
                logger.info("tokenFile %s: a new token, used from now on", self.path)
                self.token = token
            return self.token


@dataclass(frozen=True)
class KubeApi:
    host: str
    port: int
    context: ssl.SSLContext
    token: str | None = None
    prefix: str = ""  # the server URL's path
    token_file: TokenFile | None = None  # where `token` was read: read again when it changes
    # what the server's certificate is verified against, as its owner names it
    trust: str = "the system's CA certificates"
    # what the server is shown as who we are, as its owner names it
    credential: str = "no credential"
    said: _Said = field(default_factory=_Said, compare=False)

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    @cached_property
    def mask(self) -> Mask:
        """The token masked in a text: applied to every answer quoted here; a front end holds
        it for its whole process (`secret.hold`)."""
        return Mask(self.token)

    @staticmethod
    def from_kubeconfig(path: Path) -> KubeApi:
        try:
            doc: Any = parse_yaml(read_text(path))
        except (UnreadableError, ParseError) as exc:
            raise CredentialsError(
                f"--kubeconfig {path}: {exc}: name a kubeconfig file (kubectl config view "
                "--minify --raw > FILE writes one)"
            ) from None
        if not isinstance(doc, dict):
            what = "empty" if doc is None else f"a {type(doc).__name__}, not a mapping"
            raise CredentialsError(f"--kubeconfig {path}: {what}: name a kubeconfig file")
        config = cast(dict[str, Any], doc)
        step = "current-context"  # what is read now: named when it is missing or of a wrong shape
        try:
            current = config["current-context"]
            step = f"contexts: the context named {shown(current)}"
            context = _named(config["contexts"], current)["context"]
            step = f"clusters: the cluster named {shown(context['cluster'])}"
            named: Any = _named(config["clusters"], context["cluster"])["cluster"]
            if not isinstance(named, dict):
                raise TypeError  # a list or a text where a mapping goes
            cluster = cast(dict[str, Any], named)
            step += ": its server"
            server = str(cluster["server"])
            step = f"users: the user named {shown(context.get('user', ''))}"
            # a context without a user is anonymous; one naming a user that is not there is a
            # slip (kubectl refuses it too), not a wish to be anonymous
            named_user = context.get("user") or None
            entry: Any = _named(config.get("users") or [], named_user) if named_user else {}
            found: Any = entry.get("user") or {}
            if not isinstance(found, dict):
                raise TypeError
            user = cast(dict[str, Any], found)
        except (KeyError, TypeError, AttributeError):
            step = Mask(*_tokens(config))(step)  # a token pasted where a name goes is not said
            raise CredentialsError(
                f"--kubeconfig {path}: {step}: not there, or not as a kubeconfig has it: "
                "`kubectl config view --minify` shows what it holds"
            ) from None
        where = f"--kubeconfig {path}"
        unsupported = [k for k in _UNSUPPORTED if k in user]
        if unsupported:  # sent without them, every call would be refused
            raise CredentialsError(
                f"{where}: {unsupported[0]} is not supported here: give the context a token, a "
                "tokenFile or a client certificate (a service account's, for a driver)"
            )
        if "proxy-url" in cluster:  # ignored, the calls would go another way than asked
            raise CredentialsError(
                f"{where}: the cluster's proxy-url is not supported here: remove it, so that "
                "the API server is reached directly (as the node's kubelet reaches it)"
            )
        skip = cluster.get("insecure-skip-tls-verify", False)
        if not isinstance(
            skip, bool
        ):  # "false" as text is true to Python: refused, as kubectl does
            raise CredentialsError(
                f"{where}: insecure-skip-tls-verify: {described(skip)}, not true or false: {_FIX}"
            )
        tls = ssl.create_default_context()
        trust = f"the system's CA certificates ({where} names no certificate-authority)"
        if skip:
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            trust = f"the certificate-authority-data of {where}"
            data = cluster["certificate-authority-data"]
            _field(where, "certificate-authority-data", lambda: tls.load_verify_locations(
                cadata=base64.b64decode(data, validate=True).decode()))  # fmt: skip
        elif "certificate-authority" in cluster:
            ca = str(cluster["certificate-authority"])
            trust = f"the certificate-authority {ca} of {where}"
            _field(where, "certificate-authority",
                   lambda: tls.load_verify_locations(cadata=_pem(ca)), ca)  # fmt: skip
        _client_cert(where, tls, user)
        token = user.get("token")
        token_file = None
        if token is None and "tokenFile" in user:
            token_file = Path(str(user["tokenFile"]))
            token = _field(where, "tokenFile", lambda: read_text(token_file, _TOKEN_MAX)).strip()
            if not token:  # a projected token not written yet, a truncated file
                raise CredentialsError(
                    f"{where}: tokenFile {token_file}: empty: it must hold the token"
                )
        if token_file is not None:
            credential = f"the tokenFile {token_file} of {where}"
        elif token is not None:
            credential = f"the token of {where}"
        elif "client-certificate" in user or "client-certificate-data" in user:
            credential = f"the client certificate of {where}"
        else:
            credential = f"no credential ({where}'s user has none)"
        api = KubeApi.at(server, tls, token, where, trust, credential, token_file)
        if (
            token is None
            and "client-certificate" not in user
            and "client-certificate-data" not in user
        ):
            logger.warning(
                "%s: the context's user has no token, tokenFile or client certificate: every "
                "call is anonymous, which API servers refuse unless RBAC grants "
                "system:anonymous", where,
            )  # fmt: skip
        return api

    @staticmethod
    def in_cluster() -> KubeApi:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise CredentialsError(
                "not in a pod (no KUBERNETES_SERVICE_HOST): pass --kubeconfig to run outside one"
            )
        if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
            raise CredentialsError(
                f"KUBERNETES_SERVICE_PORT: {described(port)}, not a port: the kubelet sets it "
                "in a pod; outside one, pass --kubeconfig"
            )
        where = f"the pod's service account ({SERVICE_ACCOUNT})"
        fix = "mount it (automountServiceAccountToken: true), or pass --kubeconfig"
        ca = str(SERVICE_ACCOUNT / "ca.crt")
        tls = _field(where, "ca.crt", lambda: ssl.create_default_context(cadata=_pem(ca)), fix=fix)
        token = _field(
            where, "token", lambda: read_text(SERVICE_ACCOUNT / "token", _TOKEN_MAX), fix=fix
        )
        if not token.strip():
            raise CredentialsError(f"{where}: token: empty: {fix}")
        return KubeApi.at(
            f"https://{host}:{port}", tls, token.strip(), "KUBERNETES_SERVICE_HOST",
            f"the service account's {ca}", f"the service account's {SERVICE_ACCOUNT / 'token'}",
            SERVICE_ACCOUNT / "token",
        )  # fmt: skip

    @staticmethod
    def at(
        server: str,
        tls: ssl.SSLContext,
        token: object,
        where: str,
        trust: str,
        credential: str,
        token_file: Path | None = None,
    ) -> KubeApi:
        if token is not None and not isinstance(token, str):
            raise CredentialsError(f"{where}: token: {described(token)}, not text: {_FIX}")
        bearer = None if token is None else token.strip()  # a YAML block scalar's newline
        if bearer == "":
            raise CredentialsError(
                f"{where}: token: empty: give the token, or remove the field for no login"
            )
        if bearer is not None and not _TOKEN.fullmatch(bearer):  # said, never sent
            raise CredentialsError(
                f"{where}: token: {described(bearer)} with a line break, a space or a character "
                "an HTTP header cannot carry: fix it in the kubeconfig"
            )
        try:  # urlsplit drops tabs and line breaks: a server with one names another host
            url = urlsplit(server) if _TOKEN.fullmatch(server) else None
        except ValueError:  # a bad IPv6 literal (not quoted: it may hold a login)
            url = None
        host = url.hostname if url else None
        try:
            port = 443 if url is None or url.port is None else url.port
        except ValueError:  # over 65535 or not a number; not quoted either
            port = 0
        if port == 0:
            raise CredentialsError(f"{where}: server's port is not a number within 1-65535: fix it")
        if url is None or url.scheme != "https" or not host or not _is_host(host):
            raise CredentialsError(
                f"{where}: server {described(server)} is not https://HOST[:PORT]: fix it"
            )
        if url.query or url.fragment:  # dropped, the calls would go elsewhere than it says
            raise CredentialsError(
                f"{where}: server has a query or a fragment (?…, #…), which this client does not "
                "send: remove it (a token goes in the user's token field)"
            )
        if url.username is not None or url.password is not None:  # dropped, the calls anonymous
            raise CredentialsError(
                f"{where}: server has a login (USER:PASSWORD@) in it, which an API server does "
                "not take: remove it, log in with a token or a client certificate"
            )
        # a path (a proxy's, e.g. Rancher's /k8s/clusters/c-1) prefixes every call, as client-go
        rotated = None if token_file is None or bearer is None else TokenFile(token_file, bearer)
        return KubeApi(host, port, tls, bearer, url.path.rstrip("/"), rotated, trust, credential)

    def call(
        self,
        method: str,
        path: str,
        body: object | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request; the decoded JSON answer, or KubeApiError (a 404 too: `status` says)."""
        data = None if body is None else json.dumps(body).encode()
        conn = self._connection(_TIMEOUT)
        started = time.monotonic()
        # a server that takes the connection and then says nothing (no TLS handshake, no
        # status line) is said while it is waited for, not only when the wait ends
        said = "%s %s: %s has not answered after %gs: waiting up to %gs in all"
        silent = threading.Timer(
            _SLOW, lambda: logger.warning(said, method, path, self.address, _SLOW, _TIMEOUT)
        )
        silent.daemon = True
        silent.start()
        try:
            response = self._request(conn, method, path, query, data, content_type)
            silent.cancel()
            text = _body(response, f"{method} {path}", started).decode(errors="replace")
        except ssl.SSLCertVerificationError as exc:
            raise self._untrusted(f"{method} {path}", exc) from None
        except (OSError, http.client.HTTPException) as exc:
            raise KubeApiError(f"{method} {path}: {self._failed(exc)}") from None
        finally:
            silent.cancel()
            conn.close()
        if response.status != 401:
            self.said.faults.clear()
        if response.status >= 300:
            raise self._refused(method, path, response, text)
        try:
            return json.loads(text) if text else None
        except (ValueError, RecursionError):  # a proxy's page, a server that is not Kubernetes
            raise KubeApiError(
                f"{method} {path}: {response.status}, but the answer is not JSON "
                f"({len(text)} characters): is the kubeconfig's server an API server?",
                response.status,
            ) from None

    def changed(self, path: str, query: dict[str, str], since: str, within: float) -> bool:
        """Whether the collection at `path` changes after resourceVersion `since` within
        `within` seconds: a watch that the server ends then, read up to its first event (the
        caller lists again, so one is enough). An expired `since` is a change too."""
        watch = {**query, "watch": "true", "resourceVersion": since,
                 "timeoutSeconds": str(int(within))}  # fmt: skip
        conn = self._connection(within + _TIMEOUT)
        try:
            response = self._request(conn, "GET", path, watch, None, "")
            if response.status >= 300:
                text = _body(response, f"GET {path}", time.monotonic()).decode(errors="replace")
                raise self._refused("GET", path, response, text)
            event = response.readline(_BODY_MAX)
        except ssl.SSLCertVerificationError as exc:
            raise self._untrusted(f"GET {path} (watch)", exc) from None
        except (OSError, http.client.HTTPException) as exc:
            raise KubeApiError(f"GET {path} (watch): {self._failed(exc)}") from None
        finally:
            conn.close()
        if not event:  # the server ended the watch: nothing happened
            return False
        try:
            kind = json.loads(event).get("type")
        except (ValueError, RecursionError, AttributeError):
            kind = None
        if kind not in ("ADDED", "MODIFIED", "DELETED", "ERROR"):  # ERROR: 410, `since` expired
            raise KubeApiError(f"GET {path} (watch): the answer is not a watch event")
        return True

    def _untrusted(self, what: str, exc: ssl.SSLCertVerificationError) -> KubeApiError:
        """The server's certificate is not signed by what the client trusts: a fault of the
        kubeconfig (or the server), said once at ERROR with the file to fix; retried quietly."""
        if exc.verify_code in _NAME_MISMATCH:  # the CA is right: the address is not the one
            return self.said.once("name", (
                f"{what}: the certificate of {self.address} does not name {self.host} "
                f"({exc.verify_message}): give the server by an address its certificate names"
            ))  # fmt: skip
        return self.said.once("trust", (
            f"{what}: the certificate of {self.address} cannot be verified against {self.trust} "
            f"({exc.verify_message}): give the CA that signed the API server's certificate "
            "there (kubectl config view --raw shows the cluster's)"
        ))  # fmt: skip

    def _failed(self, exc: Exception) -> Exception | str:
        """Why a call failed, naming where it went (a forgotten port dials 443)."""
        if isinstance(exc, socket.gaierror):
            return (
                f"the server's host {self.host} does not resolve ({exc.strerror}): fix the server"
            )
        if isinstance(exc, OSError):  # refused, unreachable, timed out
            return f"{self.address}: {exc}"
        if isinstance(exc, http.client.IncompleteRead):
            return f"{self.address} ended its answer early: is it an API server?"
        if isinstance(exc, http.client.HTTPException):  # http.client's own words quote the peer
            return (
                f"{self.address} answered with something that is not HTTP "
                f"({type(exc).__name__}): is the kubeconfig's server an API server?"
            )
        return exc

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )

    def _request(
        self,
        conn: http.client.HTTPSConnection,
        method: str,
        path: str,
        query: dict[str, str] | None,
        data: bytes | None,
        content_type: str,
    ) -> http.client.HTTPResponse:
        headers = {"Accept": "application/json"}
        token = self.token_file.current() if self.token_file else self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if data is not None:
            headers["Content-Type"] = content_type
        target = self.prefix + path + ("?" + urlencode(query) if query else "")
        conn.request(method, target, body=data, headers=headers)
        return conn.getresponse()

    def _refused(
        self, method: str, path: str, response: http.client.HTTPResponse, text: str
    ) -> KubeApiError:
        try:
            said = str(json.loads(text).get("message", text))
        except (ValueError, AttributeError, RecursionError):
            said = text
        said = said or response.reason  # a redirect, a bare 5xx: its status line says
        # a proxy may echo the Authorization header, raw or encoded
        message = f"{method} {path}: {response.status} {one_line(self.mask(said))}"
        if response.status == 401:
            return self.said.once("credential", (
                f"{message}: the API server does not take {self.credential}: renew it (a "
                "kubeconfig's token may have expired; the kubelet rotates a pod's own)"
            ), 401)  # fmt: skip
        return KubeApiError(message, response.status)


def _tokens(config: dict[str, Any]) -> list[str]:
    """Every user's token in a kubeconfig (inline or in its file), as far as it has the shape
    to hold one."""
    users: Any = config.get("users")
    entries = cast(list[Any], users) if isinstance(users, list) else []
    found = [cast(dict[str, Any], e).get("user") for e in entries if isinstance(e, dict)]
    found_users = [cast(dict[str, Any], u) for u in found if isinstance(u, dict)]
    tokens = [u.get("token") for u in found_users]
    for file in (u.get("tokenFile") for u in found_users):
        with contextlib.suppress(UnreadableError):  # read as when it is used: a FIFO is not
            tokens.append(read_text(Path(str(file)), _TOKEN_MAX).strip() if file else None)
    return [t for t in tokens if isinstance(t, str) and t]


def _is_host(host: str) -> bool:
    """An IP address, or a DNS name a connection can take (http.client refused a space, IDNA a
    label empty or over 63 characters, with a traceback)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        name = host.encode("idna").decode().rstrip(".")
    except UnicodeError:
        return False
    return len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def _body(response: http.client.HTTPResponse, what: str, started: float) -> bytes:
    """The answer's body, read by chunks: at most _BODY_MAX bytes (a server streaming without
    end took the process to gigabytes) and _DEADLINE after the request (one dripping a byte a
    second kept a prepare waiting for minutes: each read alone is within the socket's
    timeout). Past _SLOW it is said once, while the caller still waits."""
    chunks: list[bytes] = []
    size = 0
    slow = False
    while chunk := response.read1(64 * 1024):
        size += len(chunk)
        if size > _BODY_MAX:
            raise OSError(f"the answer is over {_BODY_MAX >> 20} MiB: not read further")
        waited = time.monotonic() - started
        if waited > _DEADLINE:
            raise OSError(f"the answer took over {_DEADLINE:g}s: not read further")
        if waited > _SLOW and not slow:
            slow = True
            logger.warning(
                "%s: the API server's answer is still coming after %gs (%d bytes so far): "
                "read for up to %gs in all",
                what, _SLOW, size, _DEADLINE,
            )  # fmt: skip
        chunks.append(chunk)
    if response.length:  # read1 ends quietly where the connection does, short of its length
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)


def _named(items: Any, name: str, default: Any = None) -> Any:
    for item in items:
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise KeyError(name)


def _no_passphrase() -> str:
    """Asked for an encrypted key's passphrase (OpenSSL would prompt on a terminal, or wait)."""
    raise ValueError("the client key is encrypted: give its unencrypted PEM")


def _pem(path: str) -> str:
    """A PEM file's text, read as every file a user names is (a FIFO there blocked the start for
    ever: ssl opens its files blocking)."""
    return read_text(Path(path), _PEM_MAX)


def _client_cert(where: str, tls: ssl.SSLContext, user: dict[str, Any]) -> None:
    """A client certificate from files or inline data (ssl loads only files: both go through
    a private temporary dir, removed at once, after being read as any file a user names)."""
    if "client-certificate" in user:
        cert, key = str(user["client-certificate"]), user.get("client-key")
        pem = _field(where, "client-certificate", lambda: _pem(cert).encode(), cert)
        key_pem = b"" if key is None else _field(
            where, "client-key", lambda: _pem(str(key)).encode(), str(key)
        )  # fmt: skip
        # a cert without its key, or a key of another cert: both named, the pair is the problem
        named = "client-certificate" if key is None else "client-certificate and client-key"
        _load_chain(where, named, tls, pem, key_pem)
    elif "client-certificate-data" in user:
        pem = _field(
            where,
            "client-certificate-data",
            lambda: base64.b64decode(user["client-certificate-data"], validate=True),
        )
        key_pem = _field(
            where,
            "client-key-data",
            lambda: base64.b64decode(user.get("client-key-data", ""), validate=True),
        )
        _load_chain(where, "client-certificate-data and client-key-data", tls, pem, key_pem)


def _load_chain(where: str, named: str, tls: ssl.SSLContext, pem: bytes, key_pem: bytes) -> None:
    """ssl's load_cert_chain of this PEM data (no key: the certificate's file holds it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "crt", Path(tmp) / "key"
        cert.write_bytes(pem)
        key.write_bytes(key_pem)
        keyfile = str(key) if key_pem else None
        if keyfile is None and b"PRIVATE KEY-----" not in pem:
            raise CredentialsError(
                f"{where}: {named}: no client key beside it (client-key, or the key in the "
                "certificate's own file): add it"
            )
        _field(where, named,
               lambda: tls.load_cert_chain(str(cert), keyfile, _no_passphrase))  # fmt: skip
