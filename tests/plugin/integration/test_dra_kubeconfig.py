"""The DRA driver's kubeconfig and credentials: a field it cannot use (a CA, a client
certificate and key, a token or token file, a server URL, an auth method it does not support,
a context naming what is not there) or a pod without its service account is refused at start in
one line naming the field, never quoting a credential."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin.dra_driver import SERVER, TOKEN, _kubeconfig


def _driver_with(
    root: Path, cluster: dict[str, object], user: object
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The driver from its CLI with a kubeconfig of `cluster` and `user`, expected to stop."""
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(json.dumps(_kubeconfig(cluster, user)))
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return kubeconfig, done


B64_SECRET = base64.b64encode(b"S3cret but no PEM").decode()


@pytest.mark.parametrize(
    ("cluster", "user", "said"),
    [
        ({"server": SERVER, "certificate-authority-data": "not!!base64@@S3cret"}, {},
         "certificate-authority-data: not base64 of PEM text"),
        ({"server": SERVER, "certificate-authority-data": base64.b64encode(b"\xff\xfe").decode()},
         {}, "certificate-authority-data: not base64 of PEM text"),
        ({"server": SERVER, "certificate-authority-data": B64_SECRET}, {},
         "certificate-authority-data: not what TLS can use"),
        ({"server": SERVER, "certificate-authority": "/nonexistent/ca.crt"}, {},
         "certificate-authority: /nonexistent/ca.crt: No such file or directory"),
        ({"server": "https://127.0.0.1:99999", "insecure-skip-tls-verify": True}, {},
         "server's port is not a number within 1-65535: fix it"),
        ({"server": "https://127.0.0.1:0", "insecure-skip-tls-verify": True}, {},
         "server's port is not a number within 1-65535: fix it"),
        ({"server": "https://[::1", "insecure-skip-tls-verify": True}, {},
         "server text of 12 characters is not https://HOST[:PORT]"),
        ({"server": "https://exa mple:6443", "insecure-skip-tls-verify": True}, {},
         "server text of 21 characters is not https://HOST[:PORT]"),
        ({"server": "https://a..b", "insecure-skip-tls-verify": True}, {},
         "server text of 12 characters is not https://HOST[:PORT]"),
        ({"server": f"https://{'a' * 64}.example", "insecure-skip-tls-verify": True}, {},
         "server text of 80 characters is not https://HOST[:PORT]"),
        ({"server": "https://api\t.example", "insecure-skip-tls-verify": True}, {},
         "server text of 20 characters is not https://HOST[:PORT]"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate-data": "bad!!S3cret"}, "client-certificate-data: not base64"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "/nonexistent/c.crt", "client-key": "/nonexistent/c.key"},
         "client-certificate: /nonexistent/c.crt: No such file or directory"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "FIFO"},
         "tokenFile: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "/dev/zero"},
         "tokenFile: a character device, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"tokenFile": "/nonexistent/token"}, "tokenFile: No such file or directory"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": ""},
         "token: empty: give the token, or remove the field for no login"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "/dev/null"},
         "tokenFile: a character device, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"exec": {"command": "/nonexistent/helper"}}, "exec is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"auth-provider": {"name": "oidc"}}, "auth-provider is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"username": "u", "password": "S3cret"}, "username is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True, "proxy-url": "http://p:3128"},
         {"token": "S3cret"}, "the cluster's proxy-url is not supported here: remove it"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "S3cret\nX-Evil: 1"},
         "token: text of 16 characters with a line break, a space or a character an HTTP "
         "header cannot carry"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, ["S3cret"],
         "users: the user named 'u': not there, or not as a kubeconfig has it"),
        ({"insecure-skip-tls-verify": True}, {},
         "clusters: the cluster named 'c': its server: not there, or not as a kubeconfig has it"),
        ({"server": SERVER, "insecure-skip-tls-verify": "false"}, {},
         "insecure-skip-tls-verify: text of 5 characters, not true or false"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": ["S3cret"]},
         "token: a list of 1, not text"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "t", "as": "admin"},
         "as is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"client-key": "ENCRYPTED"},
         "client-certificate and client-key: the client key is encrypted: give its unencrypted"),
        ({"server": "https://u:S3cret@127.0.0.1:6443", "insecure-skip-tls-verify": True}, {},
         "server has a login (USER:PASSWORD@) in it, which an API server does not take"),
        ({"server": "https://127.0.0.1:6443/?access_token=S3cret", "insecure-skip-tls-verify":
          True}, {}, "server has a query or a fragment (?…, #…), which this client does not send"),
        ({"server": SERVER, "certificate-authority": "FIFO"}, {},
         "certificate-authority: @FIFO: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "FIFO", "client-key": "FIFO"},
         "client-certificate: @FIFO: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "/etc/hostname", "client-key": "FIFO"},
         "client-key: @FIFO: a FIFO, not a regular file"),
    ],
    ids=["ca-not-base64", "ca-not-text", "ca-not-pem", "ca-file-missing", "port-out-of-range",
         "port-0",
         "bad-ipv6", "host-with-a-space", "host-empty-label", "host-label-over-63",
         "host-with-a-tab", "cert-not-base64", "cert-file-missing", "token-fifo", "token-dev-zero",
         "token-missing", "token-empty", "token-file-dev-null", "exec", "auth-provider",
         "basic-auth", "proxy", "token-newline",
         "user-a-list", "no-server", "tls-skip-as-text", "token-a-list", "impersonation",
         "key-encrypted", "server-login", "server-query", "ca-fifo", "cert-fifo", "key-fifo"],
)  # fmt: skip
def test_a_kubeconfig_field_that_cannot_be_used_is_named_in_one_line(
    tmp_path: Path, cluster: dict[str, object], user: object, said: str
) -> None:
    fifo = tmp_path / "fifo"  # a FIFO opened blocking waits for a writer for ever
    os.mkfifo(fifo)
    said = said.replace("@FIFO", str(fifo))
    cluster = {k: str(fifo) if v == "FIFO" else v for k, v in cluster.items()}
    if isinstance(user, dict):
        user = {k: str(fifo) if v == "FIFO" else v for k, v in user.items()}
    if isinstance(user, dict) and user.get("client-key") == "ENCRYPTED":  # OpenSSL would prompt
        key, cert = tmp_path / "c.key", tmp_path / "c.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=u",
             "-keyout", str(key), "-out", str(cert), "-passout", "pass:S3cret"],
            check=True, capture_output=True,
        )  # fmt: skip
        user = {"client-certificate": str(cert), "client-key": str(key)}
    kubeconfig, done = _driver_with(tmp_path, cluster, user)

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"rdma-dra-driver: --kubeconfig {kubeconfig}: "), line
    assert said in line
    assert "S3cret" not in done.stderr


@pytest.mark.parametrize(("text", "said"), [("", "empty"), ("[1, 2]", "a list, not a mapping")])
def test_a_kubeconfig_that_is_not_a_mapping_says_what_it_is(
    tmp_path: Path, text: str, said: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"rdma-dra-driver: --kubeconfig {kubeconfig}: {said}: name a kubeconfig file"
    ]


def test_a_context_naming_a_user_that_is_not_there_is_refused_not_anonymous(
    tmp_path: Path,
) -> None:
    config = _kubeconfig({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "t"})
    config["users"] = [{"name": "someone-else", "user": {"token": "t"}}]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "users: the user named 'u': not there" in done.stderr


@pytest.mark.parametrize("where", ["token", "tokenFile"])
def test_a_token_pasted_as_the_current_context_is_not_said_back(tmp_path: Path, where: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    user = {"token": TOKEN} if where == "token" else {"tokenFile": str(token_file)}
    config = _kubeconfig({"server": SERVER}, user)
    kubeconfig.write_text(json.dumps({**config, "current-context": TOKEN}))

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert "contexts: the context named '<token>': not there" in done.stderr
    assert TOKEN[:8] not in done.stderr


def test_an_empty_token_file_is_named_as_empty(tmp_path: Path) -> None:
    """A projected token not written yet: said as such, not as a token of bad characters."""
    token_file = tmp_path / "token"
    token_file.write_text("\n")

    kubeconfig, done = _driver_with(
        tmp_path,
        {"server": SERVER, "insecure-skip-tls-verify": True},
        {"tokenFile": str(token_file)},
    )

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"rdma-dra-driver: --kubeconfig {kubeconfig}: tokenFile {token_file}: empty: it must hold "
        "the token"
    ]


def test_a_cert_and_a_key_that_do_not_match_are_named_together(tmp_path: Path) -> None:
    for name in ("a", "b"):
        subprocess.run(
            ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
             "-subj", f"/CN={name}", "-keyout", str(tmp_path / f"{name}.key"),
             "-out", str(tmp_path / f"{name}.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
    user = {"client-certificate": str(tmp_path / "a.crt"), "client-key": str(tmp_path / "b.key")}
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    _, done = _driver_with(tmp_path, cluster, user)

    assert done.returncode == 2, done.stderr
    assert ": client-certificate and client-key: " in done.stderr


def test_a_client_certificate_without_its_key_says_the_key_is_missing(tmp_path: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
         "-subj", "/CN=u", "-keyout", str(tmp_path / "c.key"), "-out", str(tmp_path / "c.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    _, done = _driver_with(tmp_path, cluster, {"client-certificate": str(tmp_path / "c.crt")})

    assert done.returncode == 2, done.stderr
    assert ": client-certificate: no client key beside it (client-key, or the key in the " in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("port", "said"),
    [
        ("443", "ca.crt: "),
        ("abc", "KUBERNETES_SERVICE_PORT: text of 3 characters, not a port"),
    ],
    ids=["no-service-account", "port-not-a-number"],
)
def test_in_a_pod_without_its_service_account_the_fix_is_to_mount_it(port: str, said: str) -> None:
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line
    assert "kubeconfig: " not in line
    assert "fix it in the kubeconfig" not in line
    if port == "443":
        assert line.endswith("mount it (automountServiceAccountToken: true), or pass --kubeconfig")
