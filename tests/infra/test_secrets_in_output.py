"""No secret's value in any file or line the render and the deploy driver write: a credential
in a kubeconfig (or an image reference, or a stack file) is refused unless given as a secret and
never quoted back, a secret kubeconfig reaches no rendered file, and what the Pulumi engine says
has the passphrase, the backend's token and the cloud's credentials masked."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from infra.stack.credentials import kubeconfig_credential
from infra.stack.files import StackFileError, stack_config
from infra.stack.keys import PROJECT, StackConfigError
from infra.stack.model import StackConfig, parse
from infra.stack.samples import JobSpecError, RdmaJobSpec
from tests.infra.helpers import DEPLOY, RENDER, SENTINEL, _cli, _fake_pulumi, _project_copy


def _written(root: Path) -> str:
    return "".join(p.read_text() for p in sorted(root.rglob("*")) if p.is_file())


KUBECONFIG_HEAD = """apiVersion: v1
kind: Config
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


# Credentials an inline check of token/key/password fields misses: each must need --secret.
HIDDEN = {
    "oidc-client-secret": KUBECONFIG_HEAD
    + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    + "users: [{name: u, user: {auth-provider: {name: oidc, config: "
    + f"{{client-id: k8s, client-secret: {SENTINEL}}}}}}}}}]\n",
    "exec-env": KUBECONFIG_HEAD
    + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    + "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
    + f"command: get-token, env: [{{name: TOKEN, value: {SENTINEL}}}]}}}}}}]\n",
    "password-in-server-url": KUBECONFIG_HEAD
    + f"clusters: [{{name: c, cluster: {{server: 'https://admin:{SENTINEL}@10.0.0.1:6443'}}}}]\n"
    + "users: [{name: u, user: {client-certificate: /pki/a.crt, client-key: /pki/a.key}}]\n",
    # no scheme: urlsplit reads `admin` as the scheme and the rest as a path
    "password-in-a-server-without-scheme": KUBECONFIG_HEAD
    + f"clusters: [{{name: c, cluster: {{server: 'admin:{SENTINEL}@10.0.0.1:6443'}}}}]\n"
    + "users: [{name: u, user: {client-certificate: /pki/a.crt, client-key: /pki/a.key}}]\n",
}


@pytest.mark.parametrize("kubeconfig", list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_kubeconfig_credential_in_plain_text_is_refused_without_quoting_it(
    kubeconfig: str,
) -> None:
    config, _ = stack_config("local")
    raw = {k.removeprefix(f"{PROJECT}:"): v for k, v in config.items() if v}

    with pytest.raises(StackConfigError) as caught:
        parse({**raw, "kubeconfig": kubeconfig}, secret=frozenset())

    assert "lingjun-rdma:kubeconfig: holds what may be a credential (" in str(caught.value)
    assert SENTINEL not in str(caught.value)
    assert isinstance(
        parse({**raw, "kubeconfig": kubeconfig}, frozenset({"kubeconfig"})), StackConfig
    )


@pytest.mark.parametrize("kubeconfig", list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_kubeconfig_given_as_a_secret_reaches_no_rendered_file(
    tmp_path: Path, kubeconfig: str
) -> None:
    # --set on a credential key is stored as `pulumi config set --secret` would store it
    done = _cli(
        RENDER, "--stack", "local", "--out", "out", "--set", f"kubeconfig={kubeconfig}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert SENTINEL not in done.stdout + done.stderr
    assert SENTINEL not in _written(tmp_path / "out")


@pytest.mark.parametrize("kubeconfig", ["not: [valid", f"{SENTINEL}-just-a-string"])
def test_a_kubeconfig_given_as_a_secret_must_still_be_one(tmp_path: Path, kubeconfig: str) -> None:
    done = _cli(
        RENDER, "--stack", "local", "--out", "out", f"--set=kubeconfig={kubeconfig}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:kubeconfig: not " in done.stderr
    assert SENTINEL not in done.stderr


@pytest.mark.parametrize(
    ("users", "said"),
    [
        (f"users: [{{name: u, user: {{token:{SENTINEL}}}}}]", "a field not known to be safe"),
        (f"{SENTINEL}: x\nusers: []", "a field not known to be safe"),
        ("users: []\npreferences: {colors: true}", "(preferences)"),
    ],
    ids=["flow-typo-key", "secret-as-key", "preferences"],
)
def test_a_kubeconfig_location_never_quotes_an_unknown_key(users: str, said: str) -> None:
    kubeconfig = (
        KUBECONFIG_HEAD + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    ) + users
    config, _ = stack_config("local")
    raw = {k.removeprefix(f"{PROJECT}:"): v for k, v in config.items() if v}

    with pytest.raises(StackConfigError) as caught:
        parse({**raw, "kubeconfig": kubeconfig})

    assert said in str(caught.value)
    assert SENTINEL not in str(caught.value)


_CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"


_KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("field", "data", "said"),
    [("client-certificate-data", _b64(_CERT + _KEY), "users[0].user.client-certificate-data"),
     ("certificate-authority-data", _b64(_KEY), "clusters[0].cluster.certificate-authority-data"),
     ("certificate-authority-data", "bm90IGEgY2VydA==", "clusters[0].cluster.certificate-"),
     ("certificate-authority-data", "%%%", "clusters[0].cluster.certificate-authority-data"),
     ("certificate-authority-data", _b64(_KEY.replace("PRIVATE KEY", "CERTIFICATE")),
      "clusters[0].cluster.certificate-authority-data"),
     ("client-certificate-data", _b64(_CERT + _CERT), None),
     ("certificate-authority-data", _b64(_CERT), None)],
    ids=["cert-and-key-bundle", "a-key-as-the-ca", "not-pem", "not-base64",
         "a-key-labelled-certificate", "a-chain", "a-ca"],
)  # fmt: skip
def test_inline_certificates_are_safe_only_as_certificates_alone(
    field: str, data: str, said: str | None
) -> None:
    cluster = {"server": "https://10.0.0.1:6443"}
    user = {"client-certificate": "/pki/a.crt", "client-key": "/pki/a.key"}
    (cluster if field.startswith("certificate-authority") else user)[field] = data
    kubeconfig = KUBECONFIG_HEAD + json.dumps(
        {"clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}]}
    )[1:-1].replace('], "users"', ']\n"users"')

    where = kubeconfig_credential(kubeconfig)

    if said is None:
        assert where is None
    else:
        assert where is not None
        assert where.startswith(said), where
        assert where.endswith("(not PEM certificates alone)")


def test_a_server_url_with_a_query_needs_secret() -> None:
    kubeconfig = KUBECONFIG_HEAD + (
        f"clusters: [{{name: c, cluster: {{server: 'https://10.0.0.1/?access_token={SENTINEL}'}}}}]"
    )

    where = kubeconfig_credential(kubeconfig)

    assert where is not None
    assert where == "clusters[0].cluster.server (a login, query or fragment in the URL)"


@pytest.mark.parametrize(
    "key", ["pluginImage", "perftestImage", "hpsBenchmarkImage", "ncclTestsImage"]
)
@pytest.mark.parametrize(
    "image",
    [
        f"robot:{SENTINEL}@registry.example.com/rdma/plugin:1.0",
        f"https://robot:{SENTINEL}@registry.example.com/rdma/plugin:1.0",
        f"registry.example.com/rdma/plugin:1.0?token={SENTINEL}",
    ],
    ids=["userinfo", "url", "query"],
)
def test_an_image_reference_holding_a_login_is_refused_without_quoting_it(
    tmp_path: Path, key: str, image: str
) -> None:
    samples = '--set=sampleJobs=["hps-benchmark","perftest","nccl-tests"]'
    images = [f"--set={k}=registry.example.com/x:1" for k in
              ("perftestImage", "hpsBenchmarkImage", "ncclTestsImage") if k != key]  # fmt: skip
    done = _cli(
        RENDER, "--stack", "dev", "--out", "out", samples, *images, f"--set={key}={image}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert f"lingjun-rdma:{key}: not an image reference" in done.stderr
    assert SENTINEL not in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()


def test_an_rdma_job_spec_with_a_login_in_its_image_is_refused_without_quoting_it() -> None:
    with pytest.raises(JobSpecError) as caught:
        RdmaJobSpec(name="j", image=f"u:{SENTINEL}@registry.example.com/x:1", command=("true",))

    assert "Job j: image: not an image reference" in str(caught.value)
    assert SENTINEL not in str(caught.value)


def test_an_encrypted_value_of_a_key_that_is_no_credential_is_refused(tmp_path: Path) -> None:
    project = _project_copy(tmp_path, "config:\n  lingjun-rdma:region:\n    secure: AAABAxyz\n")

    with pytest.raises(StackFileError, match=r"lingjun-rdma:region is encrypted \(secure:\), but "):
        stack_config("x", project_dir=project)


def test_an_encrypted_credential_is_taken_as_a_secret_without_its_value(tmp_path: Path) -> None:
    project = _project_copy(
        tmp_path,
        "config:\n  lingjun-rdma:clusterMode: existing\n"
        f"  lingjun-rdma:kubeconfig:\n    secure: {SENTINEL}\n",
    )

    config, secrets = stack_config("x", project_dir=project)

    assert secrets == [f"{PROJECT}:kubeconfig"]
    assert SENTINEL not in json.dumps(config)


@pytest.mark.parametrize(
    ("given", "passphrase"),
    [("env", "correct horse battery staple"), ("file", "correct horse battery staple"),
     ("env", "Ünïcödé-密码-паролька"), ("env", "P\udce4ssw\udcf6rd-battery-staple")],
    ids=["env", "file", "not-ascii", "not-utf-8"],  # the last: Latin-1 bytes, set in a shell
)  # fmt: skip
def test_the_passphrase_and_token_are_masked_and_controls_escaped_in_what_the_engine_says(
    tmp_path: Path, given: str, passphrase: str
) -> None:
    """A CLI or a plugin that prints its environment (a debug flag, a crash dump) must not put
    the stack's passphrase or the backend's token on the terminal or in a CI log."""
    token = "pul-0123456789abcdef0123456789abcdef"
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        'case "$*" in *preview*) ;; *) exit 0;; esac\n'  # the stack is selected
        'p="$PULUMI_CONFIG_PASSPHRASE$(cat "$PULUMI_CONFIG_PASSPHRASE_FILE" 2>/dev/null)"\n'
        'echo "{\\"env\\": \\"$p\\"}"; printf "$PULUMI_ACCESS_TOKEN" | base64\n'
        "printf 'clear\\033[2J screen\\n'\n"
        'echo "error: passphrase is $p" >&2; exit 3\n'
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = {"PULUMI_ACCESS_TOKEN": token}
    if given == "env":
        env["PULUMI_CONFIG_PASSPHRASE"] = passphrase
    else:
        (tmp_path / "phrase").write_text(passphrase + "\n")
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(tmp_path / "phrase")

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    said = done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "error: passphrase is [secret]" in done.stderr
    assert "battery" not in said
    assert base64.b64encode(token.encode()).decode()[:12] not in said
    assert said.count("[secret]") >= 3
    assert "clear\\x1b[2J screen" in done.stdout  # a control character escaped, secret or not


def test_cloud_and_backend_credentials_are_masked_in_what_the_engine_says(tmp_path: Path) -> None:
    """The provider's credentials come from the environment too, under either spelling, and so
    do a state bucket's (s3:// on OSS, azblob://, gs://)."""
    names = ("ALICLOUD_ACCESS_KEY", "ALICLOUD_SECRET_KEY", "ALICLOUD_SECURITY_TOKEN",
             "ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
             "ALIBABA_CLOUD_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN",
             "GOOGLE_OAUTH_ACCESS_TOKEN")  # fmt: skip
    credentials = {name: f"{i}-Zq8xR2vN7mK4pL9sT3wY6b" for i, name in enumerate(names)}
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        'case "$*" in *preview*) ;; *) exit 0;; esac\n'
        "env | grep -E '^(ALI|AWS|AZURE|GOOGLE)' | sort\n"
        'echo "error: secret=$ALICLOUD_SECRET_KEY" >&2; exit 1\n'
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = credentials

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    said = done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "error: secret=[secret]" in done.stderr
    assert "Zq8xR2vN" not in said
    assert [ln for ln in done.stdout.splitlines() if "=[secret]" in ln] == [
        f"{name}=[secret]" for name in sorted(credentials)
    ]


def test_a_passphrase_file_deploy_cannot_read_is_said_as_not_masked(tmp_path: Path) -> None:
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")
    big = tmp_path / "phrase"
    big.write_text("x" * (2 << 20))
    env = {"PULUMI_CONFIG_PASSPHRASE_FILE": str(big)}

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    assert done.stderr.splitlines()[0] == (
        f"deploy: PULUMI_CONFIG_PASSPHRASE_FILE {big}: over 1024 KiB: the passphrase in it is "
        "not masked in the engine's output"
    )


def test_a_short_passphrase_is_said_to_be_masked_only_where_it_stands_alone(
    tmp_path: Path,
) -> None:
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")
    env = {"PULUMI_CONFIG_PASSPHRASE": "Zq7Xw9K"}

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    assert done.stderr.splitlines()[0] == (
        "deploy: PULUMI_CONFIG_PASSPHRASE: fewer than 8 characters, masked in the engine's "
        "output only where it stands alone, not encoded: use a longer one"
    )
    assert "Zq7Xw9K" not in done.stdout + done.stderr
