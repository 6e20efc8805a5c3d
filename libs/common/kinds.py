"""Job kind names: the ``kind`` column's values, known without importing the executor (and so
proxmoxer). Each kind's module in ``services/executor/jobs`` sets ``KIND`` from here; the resource
types (:mod:`z9.common.resources`) name their jobs with these. A new kind adds its constant and
lists it in :data:`ALL`.
"""
from __future__ import annotations

SERVER_CREATE = "ServerCreate"
SERVER_START = "ServerStart"
SERVER_STOP = "ServerStop"
SERVER_DELETE = "ServerDelete"
ADDRESS_CREATE = "AddressCreate"
ADDRESS_ASSIGN = "AddressAssign"
ADDRESS_UNASSIGN = "AddressUnassign"
ADDRESS_DELETE = "AddressDelete"
CLUSTER_CREATE = "ClusterCreate"
CLUSTER_RECONCILE = "ClusterReconcile"
CLUSTER_DELETE = "ClusterDelete"

ALL: set[str] = {SERVER_CREATE, SERVER_START, SERVER_STOP, SERVER_DELETE,
                 ADDRESS_CREATE, ADDRESS_ASSIGN, ADDRESS_UNASSIGN, ADDRESS_DELETE,
                 CLUSTER_CREATE, CLUSTER_RECONCILE, CLUSTER_DELETE}
"""Every kind z9 runs (metrics pre-create a series for each). :func:`add` extends it (a
benchmark's no-op kind)."""


def add(kind: str) -> None:
    """Make ``kind`` known (its metric series are pre-created like the built-in kinds')."""
    ALL.add(kind)
