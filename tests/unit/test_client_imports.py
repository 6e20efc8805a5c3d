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

# one fresh interpreter (each costs a second of CPU): what is loaded after each stage, then the
# registry's client modules against the ones the client found on its own
PROBE = """
import json, sys
out = {}
import z9.client.cli
out["import z9.client.cli"] = sorted(sys.modules)
import z9.cli
z9.cli.build_parser(["servers", "list"])
out["z9.cli.build_parser()"] = sorted(sys.modules)
from z9.client.commands import COMMANDS
from z9 import resources
registry = [m for _, m in resources.slice_modules("client")]
out["found"] = [getattr(m, "__name__", "") for m in COMMANDS]
out["registry"] = [m.__name__ for m in registry]
out["same"] = all(a is b for a, b in zip(COMMANDS, registry))
print(json.dumps(out))
"""


def test_the_client_loads_no_server_side_module_and_finds_the_registrys_commands() -> None:
    out = json.loads(subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True,
                                    timeout=120).stdout.splitlines()[-1])
    for stage in ("import z9.client.cli", "z9.cli.build_parser()"):
        loaded = set(out[stage])
        assert not [m for m in SERVER_SIDE if m in loaded], (stage, sorted(m for m in SERVER_SIDE if m in loaded))
    assert "z9.resources.server.client" in out["z9.cli.build_parser()"]  # the slices' commands are there
    # without the registry the client finds each slice's client.py by its folder and the order= of
    # its ResourceType: the same modules, in the same order, as the registry gives
    found, registry = out["found"], out["registry"]
    assert registry and found[:len(registry)] == registry and out["same"], (found, registry)
    assert not [n for n in found[len(registry):] if n.startswith("z9.resources.")]


def test_the_client_sends_what_the_apis_own_models_accept() -> None:
    from z9.api import schemas, tokens
    from z9.client import models

    assert models.ServerCreate is schemas.ServerCreate
    assert (models.TokenCreate, models.Token, models.TokenCreated) == (tokens.TokenCreate, tokens.Token,
                                                                       tokens.TokenCreated)
