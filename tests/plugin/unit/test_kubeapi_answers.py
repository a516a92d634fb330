"""What the API client says of a peer that answers, but not in HTTP: a port that is not the API
server's (an SSH daemon), a broken proxy."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.core.kubeapi import KubeApi, KubeApiError


@pytest.fixture
def raw_tls(tmp_path: Path) -> Iterator[tuple[int, list[bytes]]]:
    """A TLS server that answers every connection with the bytes put in its list."""
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
                    tls.recv(65536)
                    tls.sendall(answer[0])
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
