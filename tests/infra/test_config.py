"""Stack config validation: refused before any resource is planned, naming the key and the fix."""

from __future__ import annotations

import math

import pytest
import yaml

from infra.commands.offline import RecordingMocks, run_program
from infra.stack.files import stack_config
from infra.stack.images import is_pinned
from infra.stack.keys import PROJECT, PROJECT_DIR, StackConfigError, known_keys
from infra.stack.model import BuiltImage, KubeconfigCluster, StackConfig, parse
from infra.stack.samples import JobSpecError, RdmaJobSpec, resolve_host_network
from plugin.launch import RESCAN_INTERVAL_RANGE
from tests.infra.conftest import STACKS

LOW, HIGH = RESCAN_INTERVAL_RANGE


def _raw(stack: str = "dev", **overrides: str) -> dict[str, str]:
    config, _ = stack_config(stack, [f"{k}={v}" for k, v in overrides.items()])
    prefix = f"{PROJECT}:"
    return {k.removeprefix(prefix): v for k, v in config.items() if k.startswith(prefix) and v}


def _error(stack: str = "dev", secret: frozenset[str] = frozenset(), **overrides: str) -> str:
    with pytest.raises(StackConfigError) as caught:
        parse(_raw(stack, **overrides), secret)
    return str(caught.value)


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_config_is_valid(stack: str) -> None:
    assert isinstance(parse(_raw(stack)), StackConfig)


def test_non_host_network_without_ipv6_compute_network_is_refused() -> None:
    message = _error(nonHostNetwork="true", computeNetworkIpv6="false")

    assert (
        "lingjun-rdma:nonHostNetwork: true needs lingjun-rdma:computeNetworkIpv6: true" in message
    )
    assert "(pulumi config set lingjun-rdma:computeNetworkIpv6 true)" in message


def test_refused_config_plans_no_resource() -> None:
    config, secrets = stack_config("dev", ["nonHostNetwork=true"])
    mocks = RecordingMocks()

    with pytest.raises(StackConfigError):
        run_program("dev", config, secrets, mocks)

    assert mocks.resources == []


def test_existing_mode_without_cluster_id_or_kubeconfig_is_refused() -> None:
    message = _error("local", kubeconfig="")

    assert "lingjun-rdma:clusterMode: existing needs lingjun-rdma:clusterId or" in message
    assert "pulumi config set --secret lingjun-rdma:kubeconfig" in message


def test_enabled_sample_job_without_image_is_refused() -> None:
    message = _error(hpsBenchmarkImage="")

    assert "lingjun-rdma:hpsBenchmarkImage: required because" in message
    assert "(pulumi config set lingjun-rdma:hpsBenchmarkImage <image>:<tag>)" in message


def test_unknown_sample_job_is_refused() -> None:
    message = _error(sampleJobs='["hps-benchmark", "iperf"]')

    assert "lingjun-rdma:sampleJobs: an unknown sample (text of 5 characters)" in message


def test_cidr_that_does_not_parse_is_refused() -> None:
    message = _error(vpcCidr="192.168.0.0/33")

    assert (
        "lingjun-rdma:vpcCidr: not an IPv4 CIDR like 192.168.0.0/16 (got text of 14 characters) "
        "(pulumi config set lingjun-rdma:vpcCidr 192.168.0.0/16)"
    ) in message


def test_overlapping_vswitch_cidrs_are_refused() -> None:
    message = _error(vswitchCidrs='["192.168.0.0/20", "192.168.8.0/24"]', zoneIds='["z-a", "z-b"]')

    assert "lingjun-rdma:vswitchCidrs[0]: 192.168.0.0/20 overlaps" in message
    # the fix moves the later one to the VPC's first free range of its size, not to its own value
    assert (
        "(pulumi config set --path 'lingjun-rdma:vswitchCidrs[1]' 192.168.16.0/24; "
        """render: --set 'vswitchCidrs=["192.168.0.0/20","192.168.16.0/24"]')"""
    ) in message


def test_the_fix_for_an_overlap_skips_every_range_taken() -> None:
    cidrs = '["192.168.0.0/24", "192.168.1.0/24", "192.168.0.128/25", "192.168.3.0/24"]'
    message = _error(vswitchCidrs=cidrs, zoneIds='["z-a", "z-b", "z-c", "z-d"]')

    assert "vswitchCidrs[2]' 192.168.2.0/25;" in message


def test_an_overlap_in_a_full_vpc_says_the_vpc_has_no_room() -> None:
    message = _error(
        vpcCidr="192.168.0.0/24",
        vswitchCidrs='["192.168.0.0/25", "192.168.0.128/25", "192.168.0.0/25"]',
        zoneIds='["z-a", "z-b", "z-c"]',
    )

    assert "and lingjun-rdma:vpcCidr has no /25 left (pulumi config set --path" in message


def test_vswitch_outside_the_vpc_is_refused() -> None:
    message = _error(vswitchCidrs='["10.0.0.0/24"]')

    assert "lingjun-rdma:vswitchCidrs[0]: 10.0.0.0/24 is outside lingjun-rdma:vpcCidr" in message


def test_service_cidr_overlapping_the_vpc_is_refused() -> None:
    message = _error(serviceCidr="192.168.128.0/20")

    assert "lingjun-rdma:serviceCidr: 192.168.128.0/20 overlaps lingjun-rdma:vpcCidr" in message


def test_one_zone_per_vswitch_is_required() -> None:
    message = _error(zoneIds='["z-a", "z-b"]')

    assert "lingjun-rdma:zoneIds: one zone per vSwitch CIDR" in message
    assert "pulumi config set --path 'lingjun-rdma:zoneIds[0]' cn-wulanchabu-c" in message


def test_list_key_that_is_not_json_is_refused() -> None:
    message = _error(vswitchCidrs="192.168.0.0/20")

    assert "lingjun-rdma:vswitchCidrs: not a JSON list (got text of 14 characters)" in message
    # the CLI refuses a JSON string for an array key: the fix sets the items one by one
    assert "(pulumi config set --path 'lingjun-rdma:vswitchCidrs[0]' 192.168.0.0/20, then" in (
        message
    )
    assert """render: --set 'vswitchCidrs=["192.168.0.0/20"]')""" in message


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("hca", "lingjun-rdma:rdmaResourceName: not <prefix>/<name>"),
        ("RDMA/hca", "is not a DNS subdomain"),
        ("kubernetes.io/hca", "the kubernetes.io domain is reserved by Kubernetes"),
        ("sub.k8s.io/hca", "the k8s.io domain is reserved by Kubernetes"),
        ("nvidia.com/gpu", "the nvidia.com domain is NVIDIA's"),
        ("requests.rdma/hca", "a prefix starting requests. is a quota's name"),
        ("rdma/-hca", "must be 1-63 letters"),
    ],
)
def test_invalid_resource_name_is_refused(name: str, why: str) -> None:
    message = _error(rdmaResourceName=name)

    assert "lingjun-rdma:rdmaResourceName" in message
    assert why in message


def test_unknown_key_in_the_namespace_is_refused() -> None:
    with pytest.raises(StackConfigError) as caught:
        stack_config("dev", ["nonHostNetwrok=true"])

    assert "lingjun-rdma:nonHostNetwrok: unknown key" in str(caught.value)
    assert "pulumi config rm lingjun-rdma:nonHostNetwrok" in str(caught.value)


def test_wrongly_typed_value_names_the_key() -> None:
    message = _error(lingjunNodeCount="many")

    assert message.startswith("lingjun-rdma:lingjunNodeCount:")


def test_bad_cluster_mode_names_the_choices() -> None:
    message = _error(clusterMode="adopt")

    assert "lingjun-rdma:clusterMode:" in message
    assert "'create' or 'existing'" in message


def test_max_allocations_with_exclusive_pools_is_refused() -> None:
    message = _error("prod", rdmaMaxAllocations="10")

    assert message.startswith("lingjun-rdma:rdmaMaxAllocations: ")
    assert "applies to shared pools only" in message  # the plugin's own rule, in its words
    assert "(pulumi config rm lingjun-rdma:rdmaMaxAllocations)" in message


@pytest.mark.parametrize(
    ("value", "why"),
    [("0", ": 0 is not within 1-100000 (pulumi config set"), ("100001", "100001 is not within")],
)
def test_max_allocations_out_of_the_plugins_range_is_refused(value: str, why: str) -> None:
    message = _error(rdmaMaxAllocations=value)

    assert message.startswith("lingjun-rdma:rdmaMaxAllocations:")
    assert why in message


def test_a_rescan_interval_the_plugin_would_refuse_is_refused_at_preview() -> None:
    message = _error(rdmaRescanInterval="0")

    assert message == (
        f"lingjun-rdma:rdmaRescanInterval: must be {math.ceil(LOW)}-{HIGH:g} whole seconds "
        "(pulumi config set lingjun-rdma:rdmaRescanInterval 5)"
    )


def test_creating_the_lingjun_group_needs_its_inputs() -> None:
    message = _error(lingjunMachineType="")

    assert "lingjun-rdma:lingjunMachineType: required to create the Lingjun node group" in message
    assert "lingjun-rdma:lingjunNodeGroupId" in message


def test_adopted_node_group_needs_its_lingjun_cluster() -> None:
    message = _error("staging", lingjunClusterId="")

    assert "lingjun-rdma:lingjunNodeGroupId: needs the Lingjun cluster" in message


def test_plugin_image_is_required_unless_built() -> None:
    message = _error(pluginImage="")

    assert (
        "lingjun-rdma:pluginImage: required unless lingjun-rdma:pluginImageBuild: true" in message
    )


@pytest.mark.parametrize("image", ["repo/plugin", "repo/plugin:latest", "localhost:5000/plugin"])
def test_unpinned_plugin_image_is_refused(image: str) -> None:
    message = _error(pluginImage=image)

    assert "lingjun-rdma:pluginImage: not pinned" in message


@pytest.mark.parametrize(
    "image",
    ["repo/plugin:0.1.0", "localhost:5000/plugin:1", f"r/p@sha256:{'a' * 64}",
     f"r/p@sha512:{'a' * 128}"],
)  # fmt: skip
def test_pinned_plugin_images_are_accepted(image: str) -> None:
    assert is_pinned(image)


@pytest.mark.parametrize("image", ["registry.x/a:latest", "registry.x/a", "localhost:5000/a"])
def test_an_unpinned_sample_image_is_refused_as_the_plugins_is(image: str) -> None:
    message = _error(perftestImage=image, sampleJobs='["perftest"]')

    assert "lingjun-rdma:perftestImage: not pinned: give a digest or a tag" in message


def test_plugin_image_and_build_together_are_refused() -> None:
    message = _error(pluginImageBuild="true")

    assert "set together with lingjun-rdma:pluginImageBuild: true; pick one" in message


def test_image_build_needs_an_acr_enterprise_instance() -> None:
    message = _error("prod", acrInstanceId="")

    assert (
        "lingjun-rdma:acrInstanceId: required with lingjun-rdma:pluginImageBuild: true" in message
    )
    assert "pulumi config set lingjun-rdma:acrInstanceId cri-<id>" in message


def test_acr_instance_id_must_look_like_one() -> None:
    message = _error("prod", acrInstanceId="registry.cn-wulanchabu.aliyuncs.com")

    assert "lingjun-rdma:acrInstanceId: not an ACR Enterprise Edition instance ID" in message


def test_acr_instance_id_without_image_build_is_refused() -> None:
    message = _error(acrInstanceId="cri-abc123")

    assert (
        "lingjun-rdma:acrInstanceId: only used with lingjun-rdma:pluginImageBuild: true" in message
    )


def test_registry_username_without_password_is_refused() -> None:
    message = _error("prod", registryUsername="robot")

    assert "give both, or neither" in message


@pytest.mark.parametrize("given", ["half an hour", "1.5h", "30m1h"])
def test_job_await_timeout_must_be_a_duration_of_whole_units(given: str) -> None:
    message = _error(jobAwaitTimeout=given)

    assert (
        "lingjun-rdma:jobAwaitTimeout: not a duration like 30m: whole hours, minutes and "
        f"seconds, in that order (1h30m, not 1.5h) (got text of {len(given)} characters)"
    ) in message


def test_job_await_timeout_becomes_the_jobs_deadline_in_seconds() -> None:
    assert parse(_raw(jobAwaitTimeout="30m")).job_deadline_seconds == 1800
    assert parse(_raw(jobAwaitTimeout="2h")).job_deadline_seconds == 7200
    assert parse(_raw()).job_deadline_seconds is None


@pytest.mark.parametrize("value", ["", "10", "1.5m", "0m", "5d"])
def test_plugin_await_timeout_must_be_a_duration(value: str) -> None:
    raw = {**_raw(), "pluginAwaitTimeout": value}

    with pytest.raises(StackConfigError) as caught:
        parse(raw)

    assert "lingjun-rdma:pluginAwaitTimeout:" in str(caught.value)


def test_registry_password_in_plain_text_is_refused() -> None:
    message = _error("prod", registryUsername="robot", registryPassword="hunter2")

    assert message == (
        "lingjun-rdma:registryPassword: stored in plain text: set it as a secret "
        "(pulumi config set --secret lingjun-rdma:registryPassword <password>)"
    )


def test_registry_password_set_as_a_secret_is_taken() -> None:
    raw = _raw("prod", registryUsername="robot", registryPassword="hunter2")

    config = parse(raw, frozenset({"registryPassword"}))

    assert isinstance(config.plugin_image, BuiltImage)
    assert config.plugin_image.login is not None
    assert config.plugin_image.login.password.get_secret_value() == "hunter2"


TOKEN_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: abc123}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def test_kubeconfig_with_a_credential_in_plain_text_is_refused() -> None:
    message = _error("local", kubeconfig=TOKEN_KUBECONFIG)

    assert (
        "lingjun-rdma:kubeconfig: holds what may be a credential (users[0].user.token) in "
        "plain text" in message
    )
    assert "pulumi config set --secret lingjun-rdma:kubeconfig < ~/.kube/config" in message
    assert isinstance(
        parse(_raw("local", kubeconfig=TOKEN_KUBECONFIG), frozenset({"kubeconfig"})), StackConfig
    )


def test_kubeconfig_naming_credential_files_may_be_plain_text() -> None:
    # the committed local stack's: paths to files on the control-plane node, no secret inline
    assert isinstance(parse(_raw("local")).cluster, KubeconfigCluster)


def test_every_problem_is_reported_at_once() -> None:
    message = _error(nonHostNetwork="true", pluginImage="", rdmaResourceName="hca")

    assert len(message.splitlines()) == 3


def test_hostnetwork_only_stack_refuses_a_job_asking_for_pod_networking() -> None:
    spec = RdmaJobSpec(name="iperf", image="i:1", command=("true",), host_network=False)

    with pytest.raises(JobSpecError) as caught:
        resolve_host_network(spec, non_host_network=False)

    assert "Job iperf: asks for pod networking" in str(caught.value)
    assert "pulumi config set lingjun-rdma:nonHostNetwork true" in str(caught.value)
    assert resolve_host_network(spec, non_host_network=True) is False


def test_pulumi_yaml_schema_declares_exactly_the_models_keys() -> None:
    project = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())

    assert set(project["config"]) == known_keys()


@pytest.mark.parametrize("value", ["yes", "on", "1", "True"])
def test_booleans_are_true_or_false_only(value: str) -> None:
    message = _error(ipv6=value)

    assert message.startswith("lingjun-rdma:ipv6:")
    assert "lingjun-rdma:ipv6: not a boolean: use true or false" in message
    assert repr(value) not in message


@pytest.mark.parametrize("count", ["-1", "1001", "100000000"])
def test_node_count_is_bounded_by_one_node_pool(count: str) -> None:
    message = _error(lingjunNodeCount=count)

    assert f"lingjun-rdma:lingjunNodeCount: {count} is not 0..1000" in message


@pytest.mark.parametrize("name", ["Bad_NS", "-lead", "trail-", "a" * 64, "dots.in.it"])
def test_namespace_must_be_a_kubernetes_namespace_name(name: str) -> None:
    message = _error(namespace=name)

    assert "lingjun-rdma:namespace: not a Kubernetes namespace name" in message
    assert "pulumi config set lingjun-rdma:namespace lingjun-rdma" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("namespace", "lingjun-rdma\n"),
        ("namespace", "default\n"),  # not a way around the refusal of a system namespace
        ("rdmaResourceName", "rdma/hca\n"),
        ("pluginAwaitTimeout", "10m\n"),
        ("jobAwaitTimeout", "30m\n"),
    ],
)
def test_a_trailing_newline_is_no_part_of_a_valid_value(key: str, value: str) -> None:
    # a YAML block scalar (`key: |`) ends its value with one
    assert f"lingjun-rdma:{key}:" in _error(**{key: value})


@pytest.mark.parametrize("value", ["5_0", " 5", "+5", "\u0665"])
def test_a_whole_number_is_written_in_the_digits_0_to_9_only(value: str) -> None:
    # Python's int() takes each of these; Pulumi's integer is decimal digits
    assert _error(lingjunNodeCount=value).startswith(
        "lingjun-rdma:lingjunNodeCount: not a whole number: write it in the digits 0-9 only"
    )


def test_a_zone_of_another_region_is_refused_and_one_of_its_own_is_not() -> None:
    message = _error(region="cn-hangzhou", zoneIds='["cn-wulanchabu-c"]')

    assert message == (  # the value described, not quoted: it may be a secret typed there
        "lingjun-rdma:zoneIds[0]: not a zone of lingjun-rdma:region cn-hangzhou (got text of 15 "
        "characters): name one of its zones (pulumi config set --path "
        "'lingjun-rdma:zoneIds[0]' cn-hangzhou-<zone>), or set the region the zone is in "
        "(pulumi config set lingjun-rdma:region <region>)"
    )
    assert isinstance(parse(_raw(region="cn-hangzhou", zoneIds='["cn-hangzhou-h"]')), StackConfig)
    assert "not a zone of" in _error(region="ap-southeast-1", zoneIds='["ap-southeast"]')
    assert "Sup3rSecretPW99" not in _error(zoneIds='["Sup3rSecretPW99"]')
    singapore = _raw(region="ap-southeast-1", zoneIds='["ap-southeast-1a"]')
    assert isinstance(parse(singapore), StackConfig)  # no dash before the zone's letter there


@pytest.mark.parametrize("user", ["a:b", "line\nbreak", "u" * 257, "名前"])
def test_a_registry_user_a_login_cannot_carry_is_refused_unquoted(user: str) -> None:
    secret = frozenset({"registryPassword"})
    message = _error("prod", secret, registryUsername=user, registryPassword="pw")

    assert "lingjun-rdma:registryUsername: " in message
    assert "a registry user name is 1-256 visible ASCII characters without ':'" in message
    if len(user) > 2:
        assert user not in message


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [("pluginImage", "registry.example.com/x:标签", "lingjun-rdma:pluginImage: not an image"),
     ("pluginImage", "r.example.com/x:\uff11\uff12", "lingjun-rdma:pluginImage: not an image"),
     ("lingjunNodeCount", "0" * 5000 + "1", "5001 digits, mostly leading zeros: write it")],
    ids=["han-tag", "fullwidth-digits-tag", "zero-padded-count"],
)  # fmt: skip
def test_values_only_a_unicode_rule_would_take_are_refused(key: str, value: str, said: str) -> None:
    assert said in _error("dev", **{key: value})


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [("lingjunNodeCount", "5000", "lingjun-rdma:lingjunNodeCount: 5000 is not 0..1000"),
     ("vpcCidr", "1.2.3.4/40", "lingjun-rdma:vpcCidr: not an IPv4 CIDR like 192.168.0.0/16"),
     ("vpcCidr", "10.0.0.0/30", "lingjun-rdma:vpcCidr: a /30, not /8 to /28")],
)  # fmt: skip
def test_what_only_creating_uses_is_checked_on_an_adopting_stack_too(
    key: str, value: str, said: str
) -> None:
    """`local` adopts its cluster: these were accepted there without a word."""
    assert said in _error("local", **{key: value})


@pytest.mark.parametrize(
    ("stack", "overrides", "key", "why"),
    [("local", {"lingjunNodeCount": "3"}, "lingjunNodeCount", "this stack adopts its cluster"),
     ("local", {"vpcCidr": "10.0.0.0/16"}, "vpcCidr", "this stack adopts its cluster"),
     ("local", {"zoneIds": '["cn-wulanchabu-b"]'}, "zoneIds", "this stack adopts its cluster"),
     ("dev", {"lingjunClusterId": "eflo-1", "lingjunNodeGroupId": "ng-1"}, "lingjunMachineType",
      "this stack adopts lingjun-rdma:lingjunNodeGroupId"),
     ("dev", {"lingjunClusterId": "eflo-1", "lingjunNodeGroupId": "ng-1"}, "lingjunImageId",
      "this stack adopts lingjun-rdma:lingjunNodeGroupId"),
     ("local", {"rdmaApi": "dra", "rdmaResourceName": "rdma/roce"}, "rdmaResourceName",
      "lingjun-rdma:rdmaApi is dra: pods ask by claim, the DeviceClasses name the devices"),
     ("local", {"sampleJobs": "[]", "jobAwaitTimeout": "30m"}, "jobAwaitTimeout",
      "lingjun-rdma:sampleJobs deploys no Job"),
     ("local", {"hpsBenchmarkImage": "registry.example.com/x/hps:1.0"}, "hpsBenchmarkImage",
      "lingjun-rdma:sampleJobs does not enable hps-benchmark"),
     ("dev", {"lingjunClusterId": "i118578141694745246541"}, "lingjunClusterId",
      "this stack creates its Lingjun cluster (it adopts one with a node group of it: "
      "lingjun-rdma:lingjunNodeGroupId)")],
    ids=["node-count-adopted", "vpc-adopted", "zones-adopted", "machine-type-adopted-group",
         "image-adopted-group", "resource-name-dra", "job-timeout-no-job", "image-not-enabled",
         "eflo-cluster-without-its-group"],
)  # fmt: skip
def test_a_key_the_stacks_mode_ignores_is_refused_naming_why(
    stack: str, overrides: dict[str, str], key: str, why: str
) -> None:
    """`clusterId` on a create stack was refused, but the reverse passed silently."""
    assert f"lingjun-rdma:{key}: not used: {why} (pulumi config rm lingjun-rdma:{key})" in (
        _error(stack, **overrides)
    )


def test_a_key_set_to_its_default_in_a_mode_that_ignores_it_is_no_slip() -> None:
    assert isinstance(parse(_raw("local", lingjunNodeCount="2")), StackConfig)


def test_a_sample_needing_more_nodes_than_the_stack_creates_is_refused() -> None:
    """Its fix lists the samples that fit (it said to set sampleJobs to ["perftest"])."""
    assert _error(lingjunNodeCount="1") == (
        "lingjun-rdma:sampleJobs: perftest runs on 2 nodes at once, and "
        "lingjun-rdma:lingjunNodeCount is 1: its pods would stay Pending (pulumi config set "
        "lingjun-rdma:lingjunNodeCount 2), or leave it out (pulumi config rm "
        "lingjun-rdma:sampleJobs; pulumi config set --path 'lingjun-rdma:sampleJobs[0]' "
        "hps-benchmark; pulumi config set --path 'lingjun-rdma:sampleJobs[1]' nccl-tests; "
        'render: --set \'sampleJobs=["hps-benchmark", "nccl-tests"]\')'
    )
    assert "leave it out (pulumi config rm lingjun-rdma:sampleJobs; render: --set " in _error(
        lingjunNodeCount="0"
    )


@pytest.mark.parametrize(
    ("key", "said"),
    [("poolMode", "lingjun-rdma:poolMode: unknown key: did you mean rdmaPoolMode?"),
     ("RDMAPOOLMODE", "lingjun-rdma:RDMAPOOLMODE: unknown key: did you mean rdmaPoolMode?"),
     ("maxAlloc", "lingjun-rdma:maxAlloc: unknown key: did you mean rdmaMaxAllocations?")],
    ids=["cut-at-its-start", "other-letter-case", "cut-at-both-ends"],
)  # fmt: skip
def test_an_unknown_key_is_named_with_the_known_one_it_is_near(key: str, said: str) -> None:
    """ "poolMode" was "a key that is text of 8 characters", with no known key near it."""
    with pytest.raises(StackConfigError) as refused:
        stack_config("dev", [f"{key}=x"])

    assert str(refused.value) == f"{said} (pulumi config rm lingjun-rdma:{key})"


def test_the_agents_nodes_are_ack_lingjun_label_on_a_created_cluster() -> None:
    assert parse(_raw("dev")).node_selector == {"alibabacloud.com/lingjun-worker": "true"}
    chosen = parse(_raw("dev", agentNodeSelector="rdma=yes,zone.example.com/pod=a"))
    assert chosen.node_selector == {"rdma": "yes", "zone.example.com/pod": "a"}


def test_an_adopted_cluster_must_say_which_nodes_the_agent_runs_on() -> None:
    """On a cluster adopted by kubeconfig no node carries ACK's Lingjun label unless someone
    put it there: the DaemonSet silently got no pods."""
    assert _error("local", agentNodeSelector="") == (
        "lingjun-rdma:agentNodeSelector: required on an adopted cluster: the label its RDMA "
        "nodes carry (kubectl get nodes --show-labels), as LABEL=VALUE (pulumi config set "
        "lingjun-rdma:agentNodeSelector alibabacloud.com/lingjun-worker=true)"
    )


@pytest.mark.parametrize("selector", ["rdma", "=x", "a b=c", "rdma=yes,", "x=" + "v" * 64])
def test_a_node_selector_not_as_kubernetes_spells_a_label_is_refused(selector: str) -> None:
    assert "lingjun-rdma:agentNodeSelector: its item" in _error(agentNodeSelector=selector)
