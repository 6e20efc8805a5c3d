"""Job kinds known to this process: the ``kind`` column's values are named by their types' slices
(``resources/z9/resources/<type>/__init__.py``: ``SERVER_CREATE = "ServerCreate"`` …, known without
importing the executor and so proxmoxer); the list of every kind is derived from the registry
(:func:`all_kinds`).
"""
from __future__ import annotations

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
