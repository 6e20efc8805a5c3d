"""The compose stack's region dev-1 (z9.env.example) is set up as ``z9 dev``'s: the same simulator
behind it, so the same address pool, Kubernetes images, private network and SDN zone — a walkthrough
that works on one works on the other (a compose stack once had no address pool: every server with a
public IPv4 was refused)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from z9.common.settings import RegionSettings

from z9.dev import DEV_REGION

ROOT = Path(__file__).resolve().parents[2]


def _compose_regions() -> dict:
    for line in (ROOT / "z9.env.example").read_text().splitlines():
        if line.startswith("Z9_REGIONS="):
            (value,) = shlex.split(line.partition("=")[2])
            return json.loads(value)
    raise AssertionError("z9.env.example sets no Z9_REGIONS")


def test_the_compose_stacks_dev_region_is_z9_devs() -> None:
    dev1 = _compose_regions()["dev-1"]
    own = {k: dev1.pop(k) for k in ("url", "token_id", "token_secret_file", "verify_ssl")}
    assert own["url"] == "https://sim:8006" and own["token_secret_file"] == "/run/secrets/sim_token_secret"
    assert dev1 == json.loads(json.dumps(DEV_REGION))


def test_the_compose_stacks_dev_region_is_valid_settings(tmp_path: Path) -> None:
    dev1 = _compose_regions()["dev-1"]
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    region = RegionSettings.model_validate({**dev1, "token_secret_file": str(secret)})
    assert region.address_pools and region.sdn is not None and region.kubernetes_images
