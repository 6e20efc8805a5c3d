"""Job kind names: the ``kind`` column's values, known without importing the executor (and so
proxmoxer). Each kind's module in ``services/executor/z9/executor/jobs`` sets ``KIND`` from here; the resource
types (:mod:`z9.common.resources`) name their jobs with these. A new kind adds its constant and
lists it in :data:`ALL`.
"""
from __future__ import annotations

SERVER_CREATE = "ServerCreate"
SERVER_START = "ServerStart"
SERVER_STOP = "ServerStop"
SERVER_DELETE = "ServerDelete"
SERVER_REBOOT = "ServerReboot"
SERVER_RESIZE = "ServerResize"
ADDRESS_CREATE = "AddressCreate"
ADDRESS_ASSIGN = "AddressAssign"
ADDRESS_UNASSIGN = "AddressUnassign"
ADDRESS_DELETE = "AddressDelete"
LOAD_BALANCER_CREATE = "LoadBalancerCreate"
LOAD_BALANCER_CONFIGURE = "LoadBalancerConfigure"
LOAD_BALANCER_STOP = "LoadBalancerStop"
LOAD_BALANCER_START = "LoadBalancerStart"
LOAD_BALANCER_DELETE = "LoadBalancerDelete"
LOAD_BALANCER_OBSERVE = "LoadBalancerObserve"

CLUSTER_CREATE = "ClusterCreate"
CLUSTER_RECONCILE = "ClusterReconcile"
CLUSTER_DELETE = "ClusterDelete"
CLUSTER_OBSERVE = "ClusterObserve"

VOLUME_CREATE = "VolumeCreate"
VOLUME_ATTACH = "VolumeAttach"
VOLUME_DETACH = "VolumeDetach"
VOLUME_RESIZE = "VolumeResize"
VOLUME_DELETE = "VolumeDelete"

ALL: set[str] = {SERVER_CREATE, SERVER_START, SERVER_STOP, SERVER_DELETE, SERVER_REBOOT, SERVER_RESIZE,
                 ADDRESS_CREATE, ADDRESS_ASSIGN, ADDRESS_UNASSIGN, ADDRESS_DELETE,
                 LOAD_BALANCER_CREATE, LOAD_BALANCER_CONFIGURE, LOAD_BALANCER_STOP, LOAD_BALANCER_START,
                 LOAD_BALANCER_DELETE, LOAD_BALANCER_OBSERVE,
                 CLUSTER_CREATE, CLUSTER_RECONCILE, CLUSTER_DELETE, CLUSTER_OBSERVE,
                 VOLUME_CREATE, VOLUME_ATTACH, VOLUME_DETACH, VOLUME_RESIZE, VOLUME_DELETE}
"""Every kind z9 runs (metrics pre-create a series for each). :func:`add` extends it (a
benchmark's no-op kind)."""

OBSERVE_ONLY: frozenset[str] = frozenset({LOAD_BALANCER_OBSERVE, CLUSTER_OBSERVE})
"""The periodic observe-only kinds (nobody asked for them): ``GET /v1/jobs?include_observe=false``
leaves them out."""


def add(kind: str) -> None:
    """Make ``kind`` known (its metric series are pre-created like the built-in kinds')."""
    ALL.add(kind)
