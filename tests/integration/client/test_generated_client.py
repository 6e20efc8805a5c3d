"""A client generated from the served OpenAPI document by a tool no one here wrote
(openapi-python-client, a test extra) drives one of each kind against the API: a server, an
address, a load balancer, a cluster, a token and a job read. The generator must report no
problem with the document (a schema it cannot parse is dropped with everything that refers to
it — two schemas titled ``Member`` once cost every load-balancer answer its model).

The client is generated into a temporary directory and imported from there; nothing is fetched
(the generator is an installed package)."""
from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import Stack

PACKAGE = "z9_generated"


def _generator() -> str:
    exe = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("openapi-python-client is not installed (pip install -e '.[test]')")
    return exe


@pytest.fixture
async def generated(api: Stack, tmp_path: Path) -> Iterator[Any]:
    async with api.http.get(api.base + "/openapi.json") as r:
        doc = await r.json()
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(doc))
    config = tmp_path / "config.json"
    # no post hooks: the generator would run ruff over the output (not installed, not needed)
    config.write_text(json.dumps({"package_name_override": PACKAGE, "post_hooks": []}))
    out = subprocess.run([_generator(), "generate", "--path", str(spec), "--meta", "none", "--config", str(config),
                          "--output-path", str(tmp_path / PACKAGE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # every warning of the generator is a piece of the API it left out
    assert "Warning" not in out.stdout + out.stderr, out.stdout + out.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _example(model: Any) -> dict[str, Any]:
    return dict(model.model_config["json_schema_extra"]["examples"][0])


async def test_a_generated_client_drives_every_kind(api: Stack, generated: Any) -> None:
    from z9.api import schemas
    from z9.resources.cluster import api as clusters
    from z9.resources.load_balancer import api as load_balancers

    models = importlib.import_module(f"{PACKAGE}.models")

    def mod(group: str, op: str) -> Any:  # one generated operation module (tag, operationId)
        return importlib.import_module(f"{PACKAGE}.api.{group}.{op}")

    client = generated.AuthenticatedClient(base_url=api.base, token=api.token, raise_on_unexpected_status=True)
    async with client:
        # a server: create (typed answer: the server and its job), get, list
        body = models.ServerCreate.from_dict({**_example(schemas.ServerCreate), "public_ipv4": True})
        made = await mod("servers", "create_server").asyncio(client=client, body=body)
        assert isinstance(made, models.ServerAccepted), made
        assert made.server.name == "web-1" and made.server.public_ipv4.ip.startswith("203.0.113.")
        got = await mod("servers", "get_server").asyncio(made.server.id, client=client)
        assert isinstance(got, models.ServerEnvelope) and got.server.id == made.server.id
        page = await mod("servers", "list_servers").asyncio(client=client, name="web-1")
        assert isinstance(page, models.ServersPage) and [s.id for s in page.servers] == [made.server.id]
        # a job read: the server's job, typed
        job = await mod("jobs", "get_job").asyncio(made.job.id, client=client)
        assert isinstance(job, models.Job) and job.kind == "ServerCreate" and job.resource.id == made.server.id
        # an address
        adr = await mod("addresses", "create_address").asyncio(
            client=client, body=models.AddressCreate.from_dict({"region": "dev-1", "name": "www"}))
        assert isinstance(adr, models.AddressAccepted) and adr.address.name == "www"
        # a load balancer (its answers lost their models when two schemas were titled Member)
        lb = await mod("load_balancers", "create_load_balancer").asyncio(
            client=client, body=models.LoadBalancerCreate.from_dict(_example(load_balancers.LoadBalancerCreate)))
        assert isinstance(lb, models.LoadBalancerAccepted), lb
        assert lb.load_balancer.name == "web"
        assert isinstance(lb.load_balancer.targets[0], models.TargetOut)
        one = await mod("load_balancers", "get_load_balancer").asyncio(lb.load_balancer.id, client=client)
        assert isinstance(one, models.LoadBalancerEnvelope)
        target = models.ServerTarget.from_dict({"type": "server", "server_id": made.server.id})
        added = await mod("load_balancers", "add_target_load_balancer").asyncio(lb.load_balancer.id, client=client,
                                                                                body=target)
        assert isinstance(added, models.LoadBalancerAccepted), added
        assert {t.server_id for t in added.load_balancer.targets} >= {made.server.id}
        # a cluster
        k8s = await mod("clusters", "create_cluster").asyncio(
            client=client, body=models.ClusterCreate.from_dict(_example(clusters.ClusterCreate)))
        assert isinstance(k8s, models.ClusterAccepted), k8s
        listed = await mod("clusters", "list_clusters").asyncio(client=client)
        assert isinstance(listed, models.ClustersPage) and [c.id for c in listed.clusters] == [k8s.cluster.id]
        # a token: create (its secret once), list, revoke
        tok = await mod("tokens", "create_token").asyncio(
            client=client, body=models.TokenCreate.from_dict({"name": "gen", "scopes": ["read"]}))
        assert isinstance(tok, models.TokenCreated) and tok.secret.startswith("z9t_")
        tokens = await mod("tokens", "list_tokens").asyncio(client=client)
        assert isinstance(tokens, models.TokenList) and tok.token.id in {t.id for t in tokens.tokens}
        revoked = await mod("tokens", "revoke_token").asyncio(tok.token.id, client=client)
        assert isinstance(revoked, models.TokenRevoked) and revoked.token.revoked_at is not None
        # a refusal is typed too: the Error model, its code and details
        again = await mod("servers", "create_server").asyncio(client=client, body=body)
        assert isinstance(again, models.Error) and again.error.code == "uniqueness_error", again
