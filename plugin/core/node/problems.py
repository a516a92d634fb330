"""What the core finds wrong on a node, each with the reason an operator filters by: in the log,
in `rdma_plugin_problems`, and as a Warning Event on the Node (node_events.py)."""

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


@dataclass(frozen=True)
class NodeProblem:
    reason: str
    message: str
