"""Every bad plugin config is refused with a message naming the field and the fix."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from plugin.config import ConfigError, PluginConfig, Pool, load_config, parse_config


def test_no_file_means_one_shared_pool_of_1000() -> None:
    config = load_config(Path("/nonexistent/plugin.yaml"), explicit=False)

    (pool,) = config.pools
    assert (pool.resource_name, pool.mode, pool.max_allocations) == ("rdma/hca", "shared", 1000)
    assert config.non_host_network is False


def test_explicit_missing_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"--config /nonexistent/p\.yaml: no such file"):
        load_config(Path("/nonexistent/p.yaml"), explicit=True)


def test_rendered_yaml_reads_back_to_the_same_model() -> None:
    config = parse_config(
        {"nonHostNetwork": True, "pools": [{"name": "x", "mode": "exclusive"}]}, "t"
    )

    assert parse_config(yaml.safe_load(config.to_file()), "t") == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pool": []}, "pool: unknown key: did you mean pools?"),
        (
            {'/* mine */ "pools"': []},
            "'/* mine */ \"pools\"': unknown key: JSON has no comments: remove it, or use YAML's #",
        ),
        (
            {"pools": [{"name": "a", "maxAllocations": "many"}]},
            "pools[0].maxAllocations: not a whole number (got text of 4 characters): fix this "
            "value",
        ),
        (
            {"pools": [{"name": "a", "maxAllocations": 0}]},
            "pools[0].maxAllocations: 0 is not within 1-100000: fix this value",
        ),
        (
            {"pools": [{"name": "a"}, {"name": "a", "prefix": "x.io"}]},
            "pools 0 and 1 have the same name",
        ),
        (
            {"pools": [{"name": "hca"}, {"name": "hca", "prefix": "rdma"}]},
            "pools: pools 0 and 1 have the same name: give each pool its own name",
        ),
        (
            {"pools": [{"name": "a", "prefix": "kubernetes.io"}]},
            "the kubernetes.io domain is reserved by Kubernetes",
        ),
        (
            {"pools": [{"name": "gpu", "prefix": "nvidia.com"}]},
            "pools[0].prefix: the nvidia.com domain is NVIDIA's (its GPUs' device plugin and DRA "
            "driver): a "
            "domain of your own, e.g. rdma, as in rdma/hca",
        ),
        (
            {"pools": [{"name": "a", "selector": {"vendors": ["15b3", "xyz"]}}]},
            "pools[0].selector.vendors[1]: not a PCI vendor ID: e.g. 15b3",
        ),
        (
            {"pools": [{"name": "a", "selector": {"deviceIds": ["0x1017", "10170"]}}]},
            "pools[0].selector.deviceIds[1]: not a PCI device ID: e.g. 1017",
        ),
        (
            {"pools": [{"name": "hca", "prefix": "requests.rdma"}]},
            "pools[0].prefix: a prefix starting requests. is a quota's name, not a resource's",
        ),
        (
            {"pools": [{"name": "gpu-mem", "prefix": "x.aliyun.com"}]},
            "the aliyun.com domain is Alibaba Cloud's",
        ),
        (
            {"pools": [{"name": "hca", "prefix": "RDMA.io"}]},
            "pools[0].prefix: its prefix is not a DNS subdomain (it has capitals): e.g. rdma",
        ),
        (
            {"pools": [{"name": "a", "prefix": "Bad_Domain"}]},
            "pools[0].prefix: its prefix is not a DNS subdomain: e.g. rdma, as in rdma/hca",
        ),
        (
            {"pools": [{"name": "Bad Name"}]},
            "pools[0].name: its name must be 1-63 letters, digits, '-', '_' or '.', starting and "
            "ending alphanumeric: e.g. hca, as in rdma/hca",
        ),
        (
            {"pools": [{"name": "a" * 60}]},
            "pools[0].name: device IDs would be 64 characters (max 63): shorten the pool name",
        ),
        (
            {"pools": [{"name": "a", "mode": "exclusive", "maxAllocations": 5}]},
            "pools[0].maxAllocations: applies to shared pools only",
        ),
        (
            {"pools": [{"name": "a", "mode": "exclusive"}, {"name": "b", "mode": "exclusive"}]},
            "pools: exclusive pools 0 and 1 select the same HCAs: make their selectors disjoint",
        ),
        (
            {"pools": [{"name": "a", "selector": {"linkLayers": ["RoCE"]}}]},
            "pools[0].selector.linkLayers[0]: not one of Ethernet, InfiniBand (got text of 4 "
            "characters)",
        ),
        ({"pools": []}, "no pool: list at least one"),
        ({"pools": [{"mode": "shared"}]}, "pools[0].name: missing: set it"),
        (
            {"pools": [{"name": "a", "max_allocations": 5}]},
            "pools[0].max_allocations: unknown key: the file spells it maxAllocations",
        ),
        ({"pools": [{"name": "a", "maxAllocations": "10"}]}, "not a whole number (got text of 2"),
        ({"pools": ["hca"]}, "pools[0]: expected a mapping, got text of 3 characters"),
        ({"pools": {"name": "hca"}}, "pools: expected a list of pools"),
        ("pools: []", "(top level): expected a mapping"),
        ({"pools": [{"name": "a", "selector": {"ibdevs": "mlx5_*"}}]}, "expected a list of text"),
        ({"version": "v2"}, "version: not one of v1 (got text of 2 characters): fix this value"),
        ({"nonHostNetwork": "sometimes"}, "nonHostNetwork: not true or false (got text of 9"),
        ({"pools": [{"name": "hca\n"}]}, "pools[0].name: "),  # a kubelet refuses it at Register
        ({"pools": [{"name": "hca", "prefix": "rdma\n"}]}, "pools[0].prefix: "),
    ],
)
def test_bad_config_names_the_field(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "plugin.yaml")

    assert str(err.value).startswith("plugin.yaml: ")
    assert message in str(err.value)


def test_every_problem_is_reported_at_once_with_its_location() -> None:
    data = {"nonHostNetwork": 1, "pools": [{"name": "a", "mode": "both", "selectr": {}}]}

    with pytest.raises(ConfigError) as err:
        parse_config(data, "plugin.yaml")

    assert [str(p) for p in err.value.problems] == [
        "nonHostNetwork: not true or false (got a number): fix this value",
        "pools[0].selectr: unknown key: did you mean selector?",
        "pools[0].mode: not one of shared, exclusive (got text of 4 characters): fix this value",
    ]


def test_a_pools_prefix_and_name_are_each_said() -> None:
    """Not the prefix alone, then the name once the prefix is fixed."""
    with pytest.raises(ConfigError) as err:
        parse_config({"pools": [{"name": "hcä", "prefix": "nvidia.com"}]}, "plugin.yaml")

    assert [str(p).split(":")[0] for p in err.value.problems] == [
        "pools[0].prefix",
        "pools[0].name",
    ]


def test_a_pool_built_in_code_is_checked_like_one_read_from_a_file() -> None:
    with pytest.raises(ConfigError, match="device IDs would be 64 characters"):
        Pool(name="a" * 60)
    with pytest.raises(ConfigError, match="pools 0 and 1 have the same name"):
        PluginConfig(pools=(Pool(name="a"), Pool(name="a", prefix="b.io")))


def test_the_rendered_file_keeps_its_layout() -> None:
    """The DaemonSet's config hash is taken over this text: a new spelling would roll every node."""
    text = PluginConfig(pools=(Pool(name="hca"), Pool(name="x", mode="exclusive"))).to_file()

    assert json.loads(text) == {
        "version": "v1",
        "nonHostNetwork": False,
        "pools": [
            {"name": "hca", "prefix": "rdma", "mode": "shared", "maxAllocations": 1000,
             "selector": {"vendors": [], "deviceIds": [], "drivers": [], "ibdevs": [],
                          "netdevs": [], "linkLayers": []}},
            {"name": "x", "prefix": "rdma", "mode": "exclusive",
             "selector": {"vendors": [], "deviceIds": [], "drivers": [], "ibdevs": [],
                          "netdevs": [], "linkLayers": []}},
        ],
    }  # fmt: skip


def test_the_rendered_file_and_the_same_config_in_yaml_read_the_same(tmp_path: Path) -> None:
    config = PluginConfig(non_host_network=True, pools=(Pool(name="x", mode="exclusive"),))
    rendered, hand_written = tmp_path / "rendered.yaml", tmp_path / "hand.yaml"
    rendered.write_text(config.to_file())
    hand_written.write_text(yaml.safe_dump(json.loads(config.to_file())))

    assert load_config(rendered, explicit=True) == load_config(hand_written, explicit=True)
    assert load_config(rendered, explicit=True) == config


def test_a_file_without_pools_gets_the_default_pool_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text("version: v1\nnonHostNetwork: true\n")
    caplog.set_level(logging.INFO)

    config = load_config(path, explicit=True)

    assert [p.resource_name for p in config.pools] == ["rdma/hca"]
    assert f"{path} lists no pools: serving the default pool rdma/hca" in caplog.messages
    caplog.clear()
    load_config(path, explicit=True)  # the plugin rereads it every 2 s: said once
    assert caplog.messages == []
    path.write_text("version: v1\npools: [{name: a}]\n")
    load_config(path, explicit=True)
    assert caplog.messages == []


def test_yaml_flow_style_that_is_not_json_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("{pools: [{name: a, mode: exclusive}]}\n")

    (pool,) = load_config(path, explicit=True).pools
    assert (pool.name, pool.mode) == ("a", "exclusive")


def test_invalid_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("pools: [\n")

    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path, explicit=True)


def test_a_file_of_credentials_given_as_the_config_is_not_quoted_back() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("ghp_s3cr3tTOKEN", "token.txt")

    assert "s3cr3t" not in str(err.value)
    assert "(top level): expected a mapping, got text of 15 characters" in str(err.value)
