"""One module per customer command group; each has ``register(sub, common, waiting) -> name``.

A resource kind's module declares a :class:`~._kind.KindSpec` (``KIND``: its REST shape, columns,
fields, create/update flags and actions) and ``register = KIND.register``: that one declaration is
all the client knows of the kind. A resource kind's module is its slice's ``client.py``
(``resources/z9/resources/<type>/client.py``); :data:`COMMANDS` lists them in the type registry's
order.

The client does not import the registry (:mod:`z9.resources` loads every slice's store, hence
asyncpg): when it is not loaded already, each slice folder's ``client.py`` is loaded on its own,
ordered by the ``order=`` its ``ResourceType(...)`` declares (read from the slice's
``__init__.py``, not run). tests/unit/test_client_imports.py checks this gives the registry's list."""
from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from . import catalog, context, jobs, tokens


@functools.cache
def _declared(init: Path) -> dict[str, ast.expr]:
    """The keywords of the ``ResourceType(...)`` call in a slice's ``__init__.py`` (read, not run)."""
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "ResourceType":
            return {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
    return {}


def _declared_order(init: Path) -> int:
    """The ``order=`` keyword of the ``ResourceType(...)`` call in a slice's ``__init__.py``
    (the registry's default, 100, when it gives none)."""
    order = _declared(init).get("order")
    return order.value if isinstance(order, ast.Constant) and isinstance(order.value, int) else 100


def _slice_roots() -> list[str]:
    spec = importlib.util.find_spec("z9.resources")  # finds the package without running it
    assert spec is not None and spec.submodule_search_locations
    return list(spec.submodule_search_locations)


def plannable(name: str) -> bool:
    """Whether the resource type ``name`` says which job converges it (``ResourceType.plan_of``): only
    such a type has a plan route (``POST /v1/<plural>/{id}/actions/plan``), hence ``z9 <plural> plan``."""
    if "z9.resources" in sys.modules:  # the registry is there anyway: ask it
        from z9 import resources

        rtype = resources.get(name)
        return rtype is not None and rtype.plan_of is not None
    for root in _slice_roots():
        init = Path(root) / name / "__init__.py"
        if init.exists():
            plan_of = _declared(init).get("plan_of")
            return plan_of is not None and not (isinstance(plan_of, ast.Constant) and plan_of.value is None)
    return False


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def slice_clients() -> list[ModuleType]:
    """Each resource type's ``client`` module, in the registry's order."""
    if "z9.resources" in sys.modules:  # the registry is there anyway (the API, a test): ask it
        from z9 import resources

        return [m for _, m in resources.slice_modules("client")]
    found = []
    for root in _slice_roots():
        for client in Path(root).glob("*/client.py"):
            init = client.parent / "__init__.py"
            if init.exists():
                found.append((_declared_order(init), client.parent.name, client))
    return [_load(f"z9.resources.{name}.client", path) for _, name, path in sorted(found)]


images = SimpleNamespace(register=catalog.register_images)

COMMANDS = (*slice_clients(), jobs, tokens, catalog, images, context)
"""The command groups: each registered resource type's ``client`` module (its slice's
``client.py``), in the registry's order, then the generic ones."""
