"""Job kind names: the ``kind`` column's values, known without importing the executor (and so
proxmoxer). Each kind's module in its type's slice (``resources/z9/resources/<type>/jobs``) sets
``KIND`` from here; the resource types (:mod:`z9.resources`) name their jobs with these. The list
of every kind is derived from the registry (:func:`all_kinds`).
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

_ADDED: set[str] = set()


def all_kinds() -> set[str]:
    """Every kind z9 runs (metrics pre-create a series for each): the registered resource types'
    (:mod:`z9.resources`) and those :func:`add` made known (a benchmark's no-op kind)."""
    from z9 import resources  # the registry imports this module
    return {k for t in resources.types() for k in t.kinds} | {t.periodic.kind for t in resources.periodic()} | _ADDED


def observe_only() -> frozenset[str]:
    """The periodic observe-only kinds (nobody asked for them): ``GET /v1/jobs?include_observe=false``
    leaves them out."""
    from z9 import resources
    return frozenset(t.periodic.kind for t in resources.periodic())


def add(kind: str) -> None:
    """Make ``kind`` known (its metric series are pre-created like the built-in kinds')."""
    _ADDED.add(kind)
