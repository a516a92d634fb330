"""Stack key validation as render runs it: a value of no use, of no shape, or one a cloud or
cluster would refuse later (images, CIDRs, lists, regions, IDs) is refused at once in one line
naming the stack, the key and render's own fix; a misspelt key or namespace is named with ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.stack.images import reference_problem
from infra.stack.keys import unknown_key_problems
from tests.infra.helpers import RENDER, SENTINEL, _cli


@pytest.mark.parametrize(
    "image",
    [
        "registry.cn-wulanchabu.aliyuncs.com/lingjun-rdma/rdma-device-plugin:0.1.0",
        "localhost:5000/plugin@sha256:" + "a" * 64,
        "reg.example.com/a/plugin:1@sha512:" + "0f" * 64,
        "busybox:1.36",
        "ghcr.io/a/b/c:v1.2.3-rc.1",
    ],
)
def test_image_references_of_every_form_pass(image: str) -> None:
    assert reference_problem(image) is None


@pytest.mark.parametrize(
    "image",
    ["registry.example.com/Rdma/plugin:1.0", "UPPER/x:1", "localhost:5000/A/b@sha256:" + "a" * 64],
)
def test_an_image_whose_repository_is_not_lower_case_says_so(image: str) -> None:
    assert reference_problem(image) == (
        "not an image reference ([registry[:port]/]repository[:tag][@sha256:digest]); its "
        "repository is in lower case only (a runtime refuses upper case there)"
    )


@pytest.mark.parametrize("image", ["registry.example.com/x y:1", "Reg.example.com/a b"])
def test_an_image_with_other_slips_gets_no_lower_case_hint(image: str) -> None:
    problem = reference_problem(image)

    assert problem is not None
    assert "lower case" not in problem


@pytest.mark.parametrize(
    ("setting", "said"),
    [("lingjunNodeCount=-1", "lingjun-rdma:lingjunNodeCount: -1 is not 0..1000"),
     ("nonHostNetwork=maybe", "lingjun-rdma:nonHostNetwork: not a boolean: use true or false"),
     ("vpcCidr=10.0.0.0/08", "lingjun-rdma:vpcCidr: write it as 10.0.0.0/8"),
     ("region=cn-" + "a" * 300, "lingjun-rdma:region: not a region ID (got text of 303 ")],
    ids=["out-of-range", "not-a-boolean", "cidr-not-as-written", "region-too-long"],
)  # fmt: skip
def test_a_config_refusal_is_one_line_naming_stack_key_and_fix(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set", setting, cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"render: dev: error: {said}")
    assert "(--set " in line  # render's own fix
    assert "pulumi config" not in line


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ('sampleJobs=["perftest","perftest"]', "sampleJobs: perftest is listed twice"),
        ("namespace=kube-system", "kube-system is the cluster's own"),
        ("pluginImage=UPPER/x:1", "not an image reference"),
        ("region=not a region", "region: not a region ID (got text of 12 characters)"),
        ("kubernetesVersion=banana", "kubernetesVersion: not a version as ACK spells it"),
    ],
)
def test_values_a_cloud_or_cluster_would_refuse_later_are_refused_at_once(
    tmp_path: Path, override: str, said: str
) -> None:
    extra = ["--set=perftestImage=registry.example.com/p:1"] if "sampleJobs" in override else []
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={override}", *extra,
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert said in done.stderr


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("serviceCidr=172.16.0.1/32", "lingjun-rdma:serviceCidr: a /32, not /12 to /24"),
        ("vpcCidr=192.168.0.0/30", "lingjun-rdma:vpcCidr: a /30, not /8 to /28"),
        ("pluginImage=reg.example.com:99999/a/b:1", "its registry's port is not 1-65535"),
        ("pluginImage=reg.example.com/a/b@sha256:" + "A" * 64, "its digest is not sha256"),
        ("pluginImage=reg.example.com/a/b@sha256:" + "a" * 32, "its digest is not sha256"),
        ("pluginImage=reg.example.com/a/b@md5:" + "a" * 32, "its digest is not sha256"),
        (
            "vswitchCidrs=" + json.dumps([f"10.{i // 256}.{i % 256}.0/24" for i in range(151)]),
            "lingjun-rdma:vswitchCidrs: 151 vSwitches, over a VPC's 150",
        ),
    ],
    ids=[
        "service-cidr-a-host",
        "vpc-too-small",
        "registry-port",
        "digest-upper-case",
        "digest-short",
        "digest-md5",
        "vswitches-past-quota",
    ],
)
def test_a_value_the_cloud_would_refuse_later_is_refused_at_preview(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={setting}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (
            "vpcCidr=192.168.1.0/16",
            "lingjun-rdma:vpcCidr: 192.168.1.0/16 has bits set past its prefix: the network is "
            "192.168.0.0/16 (--set vpcCidr=192.168.0.0/16)",
        ),
        (
            'vswitchCidrs=["10.0.0.0/33"]',
            "lingjun-rdma:vswitchCidrs[0]: not an IPv4 CIDR like 192.168.0.0/20 (got text of 11 "
            "characters) (--set 'vswitchCidrs=[\"192.168.0.0/20\"]')",
        ),
        (
            "zoneIds=[1]",
            "lingjun-rdma:zoneIds[0]: must be text (--set 'zoneIds=[\"cn-wulanchabu-c\"]')",
        ),
        (
            'zoneIds={"a": 1}',
            "lingjun-rdma:zoneIds: must be a list of text (--set 'zoneIds=[",
        ),
    ],
    ids=["host-bits", "list-item-cidr", "list-item-type", "list-shape"],
)
def test_a_list_or_cidr_key_refused_gets_renders_own_fix(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={setting}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert "Input should be" not in done.stderr  # pydantic's words, not the user's


def test_a_list_nested_too_deep_in_set_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000

    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set=zoneIds={deep}",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "lingjun-rdma:zoneIds: JSON nested too deep to read" in done.stderr


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("registryUsername=robot", "lingjun-rdma:registryUsername: only used with"),
        ("lingjunMachineType=efg2\nrm", "lingjunMachineType: not an Alibaba Cloud ID or name"),
        ("lingjunImageId=" + "i" * 200, "lingjunImageId: "),
        ('zoneIds=["cn-a\\nx"]', "(pulumi config set --path 'lingjun-rdma:zoneIds[0]' <id>)"),
        ("sampleJobs=[1,2]", "lingjun-rdma:sampleJobs[1]: must be text (--set 'sampleJobs=["),
        (f"ncclTestsImage=u:{SENTINEL}@registry.example.com/n:1", "ncclTestsImage: not an image"),
    ],
    ids=[
        "username-without-build",
        "id-newline",
        "id-long",
        "list-item-newline",
        "list-index",
        "unused-image-login",
    ],
)
def test_stack_values_of_no_use_or_no_shape_are_refused(
    tmp_path: Path, override: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={override}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert SENTINEL not in done.stderr


def test_an_adopted_cluster_by_id_and_by_kubeconfig_at_once_is_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", "out", "--set=clusterId=c123",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:clusterId: set together with lingjun-rdma:kubeconfig" in done.stderr


def test_an_adopted_clusters_keys_on_a_stack_that_creates_one_are_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set=clusterId=c123",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:clusterId: only used with lingjun-rdma:clusterMode: existing" in (
        done.stderr
    )


@pytest.mark.parametrize("namespace", ["lingjun-rmda", "Lingjun-RDMA"])
def test_a_key_under_a_misspelt_project_name_is_named_with_ours(
    tmp_path: Path, namespace: str
) -> None:
    done = _cli(
        RENDER, "--stack", "local", "--out", "out",
        f"--set={namespace}:rdmaPodQps=true", cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        f"lingjun-rdma:rdmaPodQps: given as {namespace}:rdmaPodQps, a namespace this program "
        f"does not read: did you mean lingjun-rdma:rdmaPodQps? (render: drop --set "
        f"{namespace}:rdmaPodQps)"
    )  # the fix where the key was given: nothing to `pulumi config rm`


@pytest.mark.parametrize(
    ("given", "said"),
    [("lingjunNodeCont=3", "lingjun-rdma:lingjunNodeCont: unknown key: did you mean "
      "lingjunNodeCount? (render: drop --set lingjunNodeCont)"),
     ("registryPassword=hunter2hunter2", "lingjun-rdma:registryPassword: only used with "
      "lingjun-rdma:pluginImageBuild: true (render: drop --set registryPassword)")],
    ids=["misspelt", "unused"],
)  # fmt: skip
def test_a_key_given_with_set_is_removed_by_dropping_that_flag(
    tmp_path: Path, given: str, said: str
) -> None:
    """Its fix was `pulumi config rm`, of a key the stack never held."""
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={given}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"render: dev: error: {said}"]


def test_a_key_in_a_stack_file_is_removed_with_the_cli() -> None:
    (said,) = unknown_key_problems(["lingjun-rdma:rdmaPodQp"])

    assert said == (
        "lingjun-rdma:rdmaPodQp: unknown key: did you mean rdmaPodQps? "
        "(pulumi config rm lingjun-rdma:rdmaPodQp)"
    )
