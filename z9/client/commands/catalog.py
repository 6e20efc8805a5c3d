"""``z9 regions`` and ``z9 images``: what can be asked for."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import Ctx, OK, table
from ._group import group, verb


def regions(ctx: Ctx) -> int:
    got = ctx.client.list_regions()
    ctx.emit({"regions": got}, lambda: table(("REGION", "IMAGES", "ADDRESS POOLS"), [
        (r["name"], ", ".join(r["images"]) or "(any)", ", ".join(f"{p['name']} {p['cidr']}" for p in r["address_pools"]))
        for r in got]))
    return OK


def images(ctx: Ctx) -> int:
    got = ctx.client.list_images(region=ctx.args.region)
    # DISK: the image's boot disk (GiB), the least --disk-gib a server of it may ask for; KUBERNETES:
    # the release it carries (a cluster's --version picks the image of its minor)
    ctx.emit({"images": got}, lambda: table(("IMAGE", "REGIONS", "DISK GIB", "KUBERNETES"), [
        (i["name"], ", ".join(i["regions"]), "-" if i.get("disk_gib") is None else f"{i['disk_gib']:g}",
         i.get("kubernetes") or "-") for i in got]))
    return OK


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "regions", "regions: list")
    verb(verbs, "list", "list the regions, their images and address pools", [common]).set_defaults(run=regions)
    return "regions"


def register_images(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "images", "images: list")
    p = verb(verbs, "list", "list the images servers can be created from", [common])
    p.add_argument("--region")
    p.set_defaults(run=images)
    return "images"
