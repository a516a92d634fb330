"""The API client against a raw TLS peer: what it says of one that answers, but not in HTTP (a
port that is not the API server's, a broken proxy), and the token it sends as its file rotates."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.secret import Mask, hold, masked
from plugin.core.kube.kubeapi import KubeApi, KubeApiError


@pytest.fixture
def raw_tls(tmp_path: Path) -> Iterator[tuple[int, list[bytes]]]:
    """A TLS server that answers every connection with the first bytes put in its list, and
    appends each request it read to it."""
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
         "-subj", "/CN=odd", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.1", 0))
    answer: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    request = tls.recv(65536)
                    tls.sendall(answer[0])
                    answer.append(request)
            except OSError:
                continue

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], answer
    server.close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "answered with something that is not HTTP (BadStatusLine)"),
        (b"HTTP/1.1 abc\r\n\r\n", "answered with something that is not HTTP (BadStatusLine)"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "ended its answer early"),
    ],
    ids=["ssh-banner", "bad-status", "cut-short"],
)
def test_an_answer_that_is_not_http_is_said_as_such_not_quoted(
    raw_tls: tuple[int, list[bytes]], answer: bytes, said: str
) -> None:
    port, answers = raw_tls
    answers.append(answer)
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    api = KubeApi("127.0.0.1", port, client, "t0k3n-abcdefgh")

    with pytest.raises(KubeApiError) as caught:
        api.call("GET", "/api/v1/nodes/n1")

    message = str(caught.value)
    assert f"GET /api/v1/nodes/n1: 127.0.0.1:{port} {said}" in message
    assert "SSH-2.0" not in message
    assert "\r" not in message


def test_a_token_file_rewritten_under_a_running_client_is_read_again(
    raw_tls: tuple[int, list[bytes]], tmp_path: Path
) -> None:
    """The kubelet rotates a pod's projected token (and a kubeconfig's tokenFile may be
    rewritten): the token read at start was sent for good, and the mask did not cover the new."""
    port, exchanged = raw_tls
    exchanged.append(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123456789\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "clusters": [{"name": "c", "cluster": {
            "server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    api = KubeApi.from_kubeconfig(kubeconfig)
    hold(api.mask)

    api.call("GET", "/api/v1/nodes/n1")
    rotated = tmp_path / "token.new"
    rotated.write_text("second-token-9876543210\n")
    os.replace(rotated, token_file)  # as the kubelet swaps it in
    api.call("GET", "/api/v1/nodes/n1")
    token_file.write_text("\n")  # being written: not a token
    api.call("GET", "/api/v1/nodes/n1")

    sent = [r.split(b"Authorization: Bearer ")[1].split(b"\r\n")[0] for r in exchanged[1:]]
    first, second = b"first-token-0123456789", b"second-token-9876543210"
    assert sent == [first, second, second]  # a file being written keeps the last good token
    assert masked("echo second-token-9876543210") == "echo <token>"
    assert masked("echo first-token-0123456789") == "echo <token>"
    hold(Mask())


@pytest.mark.parametrize(
    ("user", "anonymous"),
    [({}, True), (None, True), ({"token": "t0ken-value"}, False),
     ({"tokenFile": "TOKEN_FILE"}, False)],
    ids=["user-without-credentials", "no-user", "token", "token-file"],
)  # fmt: skip
def test_a_context_without_credentials_is_said_to_call_anonymously(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, user: dict[str, str] | None, anonymous: bool
) -> None:
    """It started and called anonymously, saying nothing: the 401s came later, one per call."""
    (tmp_path / "token").write_text("t0ken-value\n")
    if user is not None and "tokenFile" in user:
        user = {"tokenFile": str(tmp_path / "token")}
    context: dict[str, str] = {"cluster": "c"} if user is None else {"cluster": "c", "user": "u"}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "insecure-skip-tls-verify": True}}],
        "users": [] if user is None else [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": context}],
        "current-context": "x",
    }))  # fmt: skip

    KubeApi.from_kubeconfig(kubeconfig)

    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == (
        [f"--kubeconfig {kubeconfig}: the context's user has no token, tokenFile or client "
         "certificate: every call is anonymous, which API servers refuse unless RBAC grants "
         "system:anonymous"] if anonymous else []
    )  # fmt: skip


def test_a_server_the_kubeconfigs_ca_does_not_verify_is_said_once_naming_the_file(
    raw_tls: tuple[int, list[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was OpenSSL's own words ("certificate verify failed: self-signed certificate") at
    WARNING, retried forever: now one ERROR naming the CA file and the server; later calls,
    which fail alike, are marked said, for their callers to log quietly."""
    port, answers = raw_tls
    answers.append(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    other = tmp_path / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
         "-subj", "/CN=other", "-keyout", str(tmp_path / "other.key"), "-out", str(other)],
        check=True, capture_output=True,
    )  # fmt: skip
    kubeconfig = _kubeconfig(tmp_path, port, {"certificate-authority": str(other)})
    api = KubeApi.from_kubeconfig(kubeconfig)

    failures = _failures(api, 3)

    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"GET /api/v1/nodes/n1: the certificate of 127.0.0.1:{port} cannot be verified against "
        f"the certificate-authority {other} of --kubeconfig {kubeconfig} (self-signed "
        "certificate): give the CA that signed the API server's certificate there (kubectl "
        "config view --raw shows the cluster's); retrying quietly until it is mended"
    ]
    assert all(f.said for f in failures)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _failures(api: KubeApi, n: int) -> list[KubeApiError]:
    """The errors of `n` calls, each expected to fail."""
    failures = []
    for _ in range(n):
        with pytest.raises(KubeApiError) as caught:
            api.call("GET", "/api/v1/nodes/n1")
        failures.append(caught.value)
    return failures


def _kubeconfig(tmp_path: Path, port: int, cluster: dict[str, object]) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}", **cluster}}],
        "users": [{"name": "u", "user": {"token": "t0k3n-abcdefgh"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    return kubeconfig


def test_a_server_certificate_not_naming_the_address_is_said_as_such_not_as_a_bad_ca(
    raw_tls: tuple[int, list[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The CA was right (the server's own certificate), the address not one it names: the fix
    said was to change the CA."""
    port, answers = raw_tls
    answers.append(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    api = KubeApi.from_kubeconfig(
        _kubeconfig(tmp_path, port, {"certificate-authority": str(tmp_path / "c.pem")})
    )

    with pytest.raises(KubeApiError) as caught:
        api.call("GET", "/api/v1/nodes/n1")

    assert str(caught.value) == (
        f"GET /api/v1/nodes/n1: the certificate of 127.0.0.1:{port} does not name 127.0.0.1 "
        "(IP address mismatch, certificate is not valid for '127.0.0.1'.): give the server by an "
        "address its certificate names"
    )
    assert [r.levelname for r in caplog.records] == ["ERROR"]


def test_a_credential_the_server_does_not_take_is_named_and_said_once(
    raw_tls: tuple[int, list[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 401 was "401 Unauthorized" at WARNING on every retry, naming no credential."""
    port, answers = raw_tls
    body = b'{"kind":"Status","message":"Unauthorized","code":401}'
    answers.append(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    kubeconfig = _kubeconfig(tmp_path, port, {"insecure-skip-tls-verify": True})
    api = KubeApi.from_kubeconfig(kubeconfig)

    failures = _failures(api, 3)

    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"GET /api/v1/nodes/n1: 401 Unauthorized: the API server does not take the token of "
        f"--kubeconfig {kubeconfig}: renew it (a kubeconfig's token may have expired; the "
        "kubelet rotates a pod's own); retrying quietly until it is mended"
    ]
    assert all(f.said and f.status == 401 for f in failures)
