"""The client starts fast: ``import z9.client.cli`` and building the whole ``z9`` parser (what
every customer command does, ``z9 context list`` too) load none of the API's server side —
aiohttp, asyncpg, the store, the resource registry, the service settings. What the client sends is
still validated by the API's own models: they are the same classes (:mod:`z9.api.bodies`)."""
from __future__ import annotations

import json
import subprocess
import sys

SERVER_SIDE = ("aiohttp", "asyncpg", "z9.common.store", "z9.resources", "z9.api.schemas", "z9.api.tokens",
               "z9.common.settings", "opentelemetry")


def loaded_after(code: str) -> set[str]:
    """The top modules (and those of SERVER_SIDE) a fresh interpreter holds after ``code``."""
    out = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_z9_client_cli_loads_no_server_side_module() -> None:
    loaded = loaded_after("import z9.client.cli")
    assert "z9.client.cli" in loaded
    assert not [m for m in SERVER_SIDE if m in loaded], sorted(m for m in SERVER_SIDE if m in loaded)


def test_building_the_z9_parser_loads_no_server_side_module() -> None:
    loaded = loaded_after("import z9.cli\nz9.cli.build_parser()")
    assert "z9.resources.server.client" in loaded  # the slices' client commands are there
    assert not [m for m in SERVER_SIDE if m in loaded], sorted(m for m in SERVER_SIDE if m in loaded)


def test_the_client_finds_the_registrys_client_modules_in_its_order() -> None:
    """Without the registry loaded the client finds each slice's client.py by its folder and the
    ``order=`` of its ResourceType: the same modules, in the same order, as the registry gives."""
    out = subprocess.run([sys.executable, "-c", """
import json
from z9.client.commands import COMMANDS
from z9 import resources
print(json.dumps([[getattr(m, "__name__", "") for m in COMMANDS],
                  [m.__name__ for _, m in resources.slice_modules("client")],
                  all(a is b for a, (_, b) in zip(COMMANDS, resources.slice_modules("client")))]))
"""], check=True, capture_output=True, text=True, timeout=60).stdout
    found, registry, same = json.loads(out.splitlines()[-1])
    assert registry and found[:len(registry)] == registry and same, (found, registry)
    assert not [n for n in found[len(registry):] if n.startswith("z9.resources.")]


def test_the_client_sends_what_the_apis_own_models_accept() -> None:
    from z9.api import schemas, tokens
    from z9.client import models

    assert models.ServerCreate is schemas.ServerCreate
    assert (models.TokenCreate, models.Token, models.TokenCreated) == (tokens.TokenCreate, tokens.Token,
                                                                       tokens.TokenCreated)
