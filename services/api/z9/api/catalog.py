"""What a tenant can ask for: ``GET /v1/regions`` and ``GET /v1/images`` (from the settings:
``Z9_REGIONS``; no database work). A region whose ``images`` list is empty accepts any image
name (the executor then waits for such a template); it lists none here."""
from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from z9.common.errors import ValidationFailed

from . import schemas
from .resources import SETTINGS, Operation, dump


class RegionPool(schemas.Response):
    name: str
    family: int
    cidr: str


class Region(schemas.Response):
    name: str
    images: list[str] = Field(description="the images it offers (empty: any template name is accepted)")
    address_pools: list[RegionPool]


class RegionList(schemas.Response):
    regions: list[Region]


class Image(schemas.Response):
    name: str
    regions: list[str] = Field(description="the regions offering it")
    disk_gib: float | None = Field(description="its boot disk's size (GiB; the largest of its regions'): the least "
                                               "`disk_gib` a server of it may ask for; null: not configured")
    kubernetes: str | None = Field(None, description="the Kubernetes release it carries (kubeadm, kubelet, kubectl): "
                                                     "a cluster of that minor is built from it; null: none")


class ImageList(schemas.Response):
    images: list[Image]


class ImageQuery(BaseModel):
    """Query parameters of ``GET /v1/images``."""

    model_config = ConfigDict(extra="forbid")

    region: StrictStr | None = Field(None, min_length=1, max_length=63, description="only images of this region")


async def list_regions(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    regions = [{"name": name, "images": list(r.images),
                "address_pools": [{"name": p.name, "family": p.family, "cidr": str(p.cidr)} for p in r.address_pools]}
               for name, r in sorted(settings.regions.items())]
    return web.json_response(dump(RegionList, {"regions": regions}))


async def list_images(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    only = request.query.get("region")
    if only is not None and only not in settings.regions:
        raise ValidationFailed(f"region: unknown region {only!r} (known: {', '.join(sorted(settings.regions))})",
                               details=[{"field": "region", "message": "unknown region"}])
    offered: dict[str, list[str]] = {}
    sizes: dict[str, float] = {}
    releases: dict[str, str] = {}
    for name, r in sorted(settings.regions.items()):
        if only is None or name == only:
            for image in [*r.images, *(i for i in r.kubernetes_images if i not in r.images)]:
                offered.setdefault(image, []).append(name)
                if image in r.image_disk_gib:
                    sizes[image] = max(sizes.get(image, 0.0), r.image_disk_gib[image])
                if image in r.kubernetes_images:
                    releases[image] = r.kubernetes_images[image]
    return web.json_response(dump(ImageList, {"images": [{"name": i, "regions": rs, "disk_gib": sizes.get(i),
                                                          "kubernetes": releases.get(i)}
                                                         for i, rs in sorted(offered.items())]}))


def operations() -> list[Operation]:
    errors: dict[int, Any] = {401: None, 429: None}
    return [
        Operation("GET", "/regions", list_regions, "listRegions", "List the regions, their images and address pools",
                  "regions", {200: RegionList, 400: None, **errors},
                  example={"regions": [{"name": "dev-1", "images": ["debian-12"],
                                        "address_pools": [{"name": "public", "family": 4, "cidr": "203.0.113.0/24"}]}]}),
        Operation("GET", "/images", list_images, "listImages", "List the images servers can be created from",
                  "regions", {200: ImageList, 400: None, 422: None, **errors}, query=ImageQuery,
                  example={"images": [{"name": "debian-12", "regions": ["dev-1"], "disk_gib": 2, "kubernetes": None},
                                      {"name": "debian-12-k8s-1.33", "regions": ["dev-1"], "disk_gib": 4,
                                       "kubernetes": "1.33.5"}]}),
    ]
