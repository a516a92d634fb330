"""The plugin's own models from the stack's keys: its config (the one pool, the network mode)
and the DaemonSet's launch spec. The plugin decides what is legal; its refusals carry their
field, which a table here maps to the stack key that set it."""

from __future__ import annotations

import math
import os

from infra.stack.keys import Keys
from infra.stack.keys import config_set as _set
from infra.stack.keys import qualified as _key
from plugin.config import (
    DEFAULT_MAX_ALLOCATIONS,
    DEFAULT_RESOURCE_NAME,
    ConfigError,
    PluginConfig,
    Pool,
    Problem,
    check_resource_name,
    parse_pool,
    shared_device_id,
)
from plugin.core.node import pools
from plugin.deviceplugin.wire import KUBELET_MESSAGE_MAX, list_and_watch_response
from plugin.launch import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_DEVICE_PLUGIN_DIR,
    MAX_UNIX_PATH,
    RESCAN_INTERVAL_RANGE,
    DraLaunchSpec,
    LaunchError,
    LaunchSpec,
    socket_name,
)

# Which stack key holds each field of the plugin's Pool (its refusals name the field), and the
# value its fix suggests.
_POOL_KEYS = {"name": "rdmaResourceName", "prefix": "rdmaResourceName",
              "maxAllocations": "rdmaMaxAllocations", "mode": "rdmaPoolMode"}  # fmt: skip
_POOL_FIX = {
    "rdmaResourceName": DEFAULT_RESOURCE_NAME,
    "rdmaMaxAllocations": str(DEFAULT_MAX_ALLOCATIONS),
    "rdmaPoolMode": "shared",
}


def plugin_config(k: Keys) -> tuple[PluginConfig | None, list[str]]:
    """The plugin's own config from the stack keys: the plugin's model decides what is legal."""
    key = "rdmaResourceName"
    try:
        check_resource_name(k.rdma_resource_name)
    except ConfigError as exc:
        return None, [f"{_key(key)}: {exc.why}: {exc.fix} {_set(key, DEFAULT_RESOURCE_NAME)}"]
    prefix, _, name = k.rdma_resource_name.partition("/")
    fields: dict[str, object] = {"name": name, "prefix": prefix, "mode": k.rdma_pool_mode}
    if k.rdma_pool_mode == "shared" or k.rdma_max_allocations != DEFAULT_MAX_ALLOCATIONS:
        fields["maxAllocations"] = k.rdma_max_allocations  # the plugin refuses it if exclusive
    try:
        pool = parse_pool(fields)
    except ConfigError as exc:
        return None, [_pool_problem(p) for p in exc.problems]
    socket = DEFAULT_DEVICE_PLUGIN_DIR / socket_name(pool.resource_name)
    if len(os.fsencode(socket)) > MAX_UNIX_PATH:  # the plugin would refuse to start on every node
        return None, [
            f"{_key(key)}: its socket in the kubelet's {DEFAULT_DEVICE_PLUGIN_DIR} would be "
            f"{len(os.fsencode(socket))} bytes, over the {MAX_UNIX_PATH}-byte limit of a unix "
            f"socket: a shorter name {_set(key, DEFAULT_RESOURCE_NAME)}"
        ]
    if k.rdma_api == "devicePlugin" and (fit := _listed_ids(pool)) < pool.max_allocations:
        return None, [
            f"{_key('rdmaMaxAllocations')}: {pool.max_allocations} IDs of up to "
            f"{len(shared_device_id(pool.name, pool.max_allocations - 1))} characters (the "
            f"pool's name and a number) are over the {KUBELET_MESSAGE_MAX >> 20} MiB the "
            f"kubelet reads of a device list, even without NUMA nodes: at most {fit} fit "
            f"{_set('rdmaMaxAllocations', str(fit))}, or a shorter rdmaResourceName"
        ]
    return PluginConfig(non_host_network=k.non_host_network, pools=(pool,)), []


def _listed_ids(pool: Pool) -> int:
    """How many of a shared pool's IDs the kubelet would be sent at the least (healthy, no
    NUMA node): a node's topology only makes each longer, which the plugin says at run time."""
    if pool.mode != "shared":
        return pool.max_allocations
    devices = tuple(
        pools.Device(shared_device_id(pool.name, i), True, (), ())
        for i in range(pool.max_allocations)
    )
    view = pools.PoolView(pool=pool, hcas=(), devices=devices, rdma_cm=True)
    return len(list_and_watch_response(view).devices)


def plugin_launch(k: Keys) -> tuple[LaunchSpec | DraLaunchSpec | None, list[str]]:
    """The DaemonSet's flags (the device plugin's, or the DRA driver's with rdmaApi: dra); the
    plugin's launch specs decide what is legal."""
    kind = DraLaunchSpec if k.rdma_api == "dra" else LaunchSpec
    try:
        # sysfs, not auto: the container has no device-cgroup grant to open the verbs devices,
        # so auto would only import pyverbs (+5.5 MiB RSS) to fall back to sysfs. The DRA
        # driver's node name comes from the pod's env (NODE_NAME, the downward API).
        spec = kind(
            config=DEFAULT_CONFIG_PATH,
            discovery="sysfs",
            rescan_interval=k.rdma_rescan_interval,
            port_counters="on" if k.rdma_port_counters else "off",
            pod_qps="on" if k.rdma_pod_qps else "off",
        )
    except LaunchError:
        key = "rdmaRescanInterval"
        low, high = RESCAN_INTERVAL_RANGE  # the stack key is whole seconds within the plugin's
        return None, [
            f"{_key(key)}: must be {max(1, math.ceil(low))}-{high:g} whole seconds "
            f"{_set(key, f'{LaunchSpec().rescan_interval:g}')}"
        ]
    return spec, []


def _pool_problem(problem: Problem) -> str:
    """A refusal of the plugin's Pool as the stack key that set the field, with the stack's own
    fix (a pulumi config command) for the plugin file's."""
    key = _POOL_KEYS[str(problem.loc[0])]
    fix = f"(pulumi config rm {_key(key)})" if problem.remove else _set(key, _POOL_FIX[key])
    return f"{_key(key)}: {problem.message} {fix}"
