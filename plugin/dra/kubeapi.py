"""The few Kubernetes API calls the DRA driver makes (ResourceSlices, ResourceClaims), over
HTTPS with the standard library: a client library would cost more memory than the driver's
whole core. Credentials come from a kubeconfig (run outside a pod) or from the pod's service
account. Blocking: the driver calls it from a thread."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

from plugin.core.userfiles import ParseError, UnreadableError, parse_yaml, read_text

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TIMEOUT = 15.0


class KubeApiError(RuntimeError):
    """A call the API server refused or could not be made; `status` is the HTTP code (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class CredentialsError(ValueError):
    """No usable credentials: the message names the file or field and the fix."""


@dataclass(frozen=True)
class KubeApi:
    host: str
    port: int
    context: ssl.SSLContext
    token: str | None = None

    @staticmethod
    def from_kubeconfig(path: Path) -> KubeApi:
        try:
            doc: Any = parse_yaml(read_text(path))
        except (UnreadableError, ParseError) as exc:
            raise CredentialsError(f"--kubeconfig {path}: {exc}") from None
        try:
            config = cast(dict[str, Any], doc)
            current = config["current-context"]
            context = _named(config["contexts"], current)["context"]
            cluster = _named(config["clusters"], context["cluster"])["cluster"]
            user = _named(config.get("users") or [], context.get("user", ""), {})
            user = cast(dict[str, Any], user.get("user") or {})
            server = str(cluster["server"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise CredentialsError(
                f"--kubeconfig {path}: no current context with a cluster and server ({exc}): "
                "`kubectl config view --minify` shows what it holds"
            ) from None
        tls = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            tls.load_verify_locations(cadata=ca)
        elif "certificate-authority" in cluster:
            tls.load_verify_locations(cafile=cluster["certificate-authority"])
        _client_cert(tls, user)
        token = user.get("token")
        if token is None and "tokenFile" in user:
            token = Path(user["tokenFile"]).read_text().strip()
        return KubeApi.at(server, tls, token)

    @staticmethod
    def in_cluster() -> KubeApi:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise CredentialsError(
                "not in a pod (no KUBERNETES_SERVICE_HOST): pass --kubeconfig to run outside one"
            )
        tls = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        return KubeApi.at(f"https://{host}:{port}", tls, token)

    @staticmethod
    def at(server: str, tls: ssl.SSLContext, token: str | None) -> KubeApi:
        url = urlsplit(server)
        if url.scheme != "https" or not url.hostname:
            raise CredentialsError(f"server {url.scheme}://{url.hostname}: expected https://HOST")
        return KubeApi(url.hostname, url.port or 443, tls, token)

    def call(
        self,
        method: str,
        path: str,
        body: object | None = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """One request; the decoded JSON answer, or KubeApiError (a 404 too: `status` says)."""
        target = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=_TIMEOUT
        )
        try:
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            raise KubeApiError(f"{method} {path}: {exc}") from None
        finally:
            conn.close()
        if response.status >= 300:
            try:
                said = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                said = text
            raise KubeApiError(f"{method} {path}: {response.status} {said}", response.status)
        return json.loads(text) if text else None


def _named(items: Any, name: str, default: Any = None) -> Any:
    for item in items:
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise KeyError(name)


def _client_cert(tls: ssl.SSLContext, user: dict[str, Any]) -> None:
    """A client certificate from files or inline data (ssl loads only files: inline data goes
    through a private temporary dir, removed at once)."""
    if "client-certificate" in user:
        tls.load_cert_chain(user["client-certificate"], user.get("client-key"))
    elif "client-certificate-data" in user:
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "crt", Path(tmp) / "key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user.get("client-key-data", "")))
            tls.load_cert_chain(str(cert), str(key))
