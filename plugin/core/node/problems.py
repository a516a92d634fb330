"""What the core finds wrong on a node, each with the reason an operator filters by: in the log,
in `rdma_plugin_problems`, and as a Warning Event on the Node (node_events.py); and, for each
reason, its usual cause and what to do (`python -m plugin.diagnose` and the README say them)."""

from __future__ import annotations

from dataclasses import dataclass

# The reasons, as an Event's `reason` (CamelCase, one per kind of problem).
NO_RDMA_CM = "RdmaCmMissing"
SCAN_ERROR = "RdmaScanError"
POOL_CONFLICT = "RdmaPoolConflict"
HCA_UNREADABLE = "RdmaHcaUnreadable"
HCA_UNHEALTHY = "RdmaHcaUnhealthy"
HCA_GONE = "RdmaHcaGone"
HCA_SKIPPED = "RdmaHcaSkipped"
POOL_EMPTY = "RdmaPoolMatchesNothing"
NON_HOST_NETWORK = "RdmaNonHostNetworkNotReady"
REGISTRATION = "RdmaRegistrationFailing"
POOL_TOO_LARGE = "RdmaPoolTooLarge"

# Each reason's usual cause, and what to do: the message itself names the HCA, port or pool.
FIXES = {
    NO_RDMA_CM: "the rdma_ucm module is not loaded: modprobe rdma_ucm (or add it to "
    "/etc/modules-load.d); pods get no connection manager until then",
    SCAN_ERROR: "sysfs could not be read as a whole: the message says what; the last good "
    "scan is served meanwhile",
    POOL_CONFLICT: "two pools select one HCA and one is exclusive: make the selectors of the "
    "plugin config disjoint",
    HCA_UNREADABLE: "a file of the HCA's sysfs entry could not be read: check dmesg for the "
    "driver's errors; the HCA is left out until it reads",
    HCA_UNHEALTHY: "no port of the HCA is ACTIVE, or it has no device node: check the cable, "
    "the switch port and the netdev's carrier (ip link, rdma link show)",
    HCA_GONE: "an HCA served before disappeared: unplugged, its driver unloaded (dmesg), or "
    "renamed (rdma dev); it is served again when it is back",
    HCA_SKIPPED: "the HCA cannot be offered by its pool (a name too long for a device ID or "
    "name): rename the pool or the HCA, as the message says",
    POOL_EMPTY: "the pool has no HCA: its selector matches none of this node's, or the RDMA "
    "driver is not loaded: fix the selector, or load the driver",
    NON_HOST_NETWORK: "nonHostNetwork is on, but pods off the host network cannot use RDMA "
    "here: the node needs IPv6 RoCE v2 GIDs and the shared RDMA netns mode",
    REGISTRATION: "the kubelet does not take the agent's registration: the message has the "
    "kubelet's words; check its log (journalctl -u kubelet)",
    POOL_TOO_LARGE: "the pool's device list is over what the kubelet reads of one message: "
    "lower maxAllocations to what the message says fits",
}


@dataclass(frozen=True)
class NodeProblem:
    reason: str
    message: str
