"""The ``cluster`` type's API registration (issue 11): ``/v1/clusters``.

- ``POST`` — in one transaction: the cluster row, its PKI (made here with ``cryptography``, sealed
  with the installation key, the cluster id as associated data), its control-plane endpoint
  address (the lowest free IP of the region's pool, protected against deletion through
  /v1/addresses) and its ClusterCreate job.
- ``GET /v1/clusters/{id}/kubeconfig?expiry_s=`` — a kubeconfig with a freshly minted client
  certificate (``kubeadm:cluster-admins``) valid ``expiry_s`` seconds; 409 ``cluster_not_ready``
  before the cluster first had every desired member Ready. It is a cluster-admin credential, so
  minting one needs the ``write`` scope (403 ``insufficient_scope`` for a read token, though the
  route is a GET); ``expiry_s`` is at most ``Z9_KUBECONFIG_MAX_EXPIRY_S`` (422 naming it) and the
  certificate never outlives the minting token (capped at its expiry). Every one minted is
  recorded: ``GET /v1/clusters/{id}/credentials`` (who, when, until when, serial, still trusted).
- ``POST …/actions/rotate-credentials`` — a new users' client CA (sealed like the other keys) and a
  ClusterReconcile that writes the new bundle to every control plane's ``--client-ca-file``: every
  kubeconfig minted before stops working (202). The cluster CA and the components' certificates
  are untouched. A cluster made before z9 had a users' client CA answers 409 ``client_ca_unsupported``
  (its kubeconfigs are signed by the cluster CA itself).
- ``POST …/actions/add-node-pool | resize-node-pool | remove-node-pool`` — the new desired shape
  and a ClusterReconcile job (202).
- ``DELETE`` — the generic immediate deletion: ``destroying`` and ClusterDelete at once; a live
  create/reconcile is superseded between its steps (``ResourceType.superseded_by``).
"""
from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from z9.common import pki, store
from z9.common.errors import ApiError, Conflict, Forbidden, NotFound, UniqueViolation, ValidationFailed, deleting
from z9.common.ids import new_id
from z9.resources.cluster.model import Cluster
from z9.resources.cluster import CLUSTER, STATUSES
from z9.common.settings import Settings

from z9.api import quotas, schemas
from z9.resources.address import api as addresses
from z9.api.resources import (NOTIFIER, POOL, SETTINGS, clock_of, ApiResource, action_transaction, CreateContext, Operation,
                              dump, idempotency_begin, idempotency_end, idempotency_key, limit_param, parse_body, path_id,
                              request_hash, room_for_a_job, tenant)
from z9.resources.address import store as address_store
from z9.resources.cluster import store as cluster_store
from z9.resources.cluster import CLUSTER_CREATE, CLUSTER_RECONCILE

VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34")
MAX_POOL_COUNT = 100
MAX_POOLS = 16
# member names are <pool>-<ordinal> ("cp" is the control plane's); a member name is at most 31
# characters (vm_clone_requests.member, the ledger of every clone): a pool name leaves room for
# "-99", the highest ordinal of a pool of MAX_POOL_COUNT
POOL_NAME = r"^[a-z][a-z0-9-]{0,27}$"
KUBECONFIG_EXPIRY_S = (60, 365 * 86400)


class InstallationKeyMissing(ApiError):
    status, code = 503, "installation_key_missing"


# kubeadm's preflight on a control plane (cmd/kubeadm/app/preflight/checks.go InitNodeChecks, run by
# init and by a control plane's join): NumCPUCheck{ControlPlaneNumCPU} and MemCheck{ControlPlaneMem},
# cmd/kubeadm/app/constants/constants.go: ControlPlaneNumCPU = 2, ControlPlaneMem = 1700 (MB, of
# sysinfo's Totalram — what the guest's kernel reports, below the VM's memory). z9 passes no
# --ignore-preflight-errors: a smaller control plane never initializes. The memory minimum is
# kubeadm's documented "2 GB or more of RAM per machine" (kubeadm install docs, "Before you begin"),
# which leaves the kernel its share above 1700 MB.
KUBEADM_CONTROL_PLANE_NUM_CPU = 2
KUBEADM_CONTROL_PLANE_MEM_MB = 1700
CONTROL_PLANE_MIN_MEMORY_MIB = 2048


class ControlPlaneSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: Literal[1, 3, 5] = Field(description="etcd quorum: 1, 3 or 5 control-plane members")
    cores: StrictInt = Field(2, ge=KUBEADM_CONTROL_PLANE_NUM_CPU, le=64,
                             description="at least 2: kubeadm's preflight (ControlPlaneNumCPU)")
    memory_mib: StrictInt = Field(4096, ge=CONTROL_PLANE_MIN_MEMORY_MIB, le=1048576,
                                  description="at least 2048: kubeadm's preflight needs 1700 MB of the guest's "
                                              "RAM (ControlPlaneMem)")
    disk_gib: StrictInt = Field(30, ge=10, le=65536)

    @field_validator("cores", mode="before")
    @classmethod
    def _kubeadm_cpus(cls, v: Any) -> Any:
        if type(v) is int and v < KUBEADM_CONTROL_PLANE_NUM_CPU:
            raise ValueError(f"kubeadm's preflight refuses a control plane of fewer than "
                             f"{KUBEADM_CONTROL_PLANE_NUM_CPU} CPUs (ControlPlaneNumCPU = "
                             f"{KUBEADM_CONTROL_PLANE_NUM_CPU}): at least {KUBEADM_CONTROL_PLANE_NUM_CPU} cores")
        return v

    @field_validator("memory_mib", mode="before")
    @classmethod
    def _kubeadm_memory(cls, v: Any) -> Any:
        if type(v) is int and v < CONTROL_PLANE_MIN_MEMORY_MIB:
            raise ValueError(f"kubeadm's preflight refuses a control plane with less than "
                             f"{KUBEADM_CONTROL_PLANE_MEM_MB} MB of RAM in the guest (ControlPlaneMem = "
                             f"{KUBEADM_CONTROL_PLANE_MEM_MB}), which the kernel reports below the VM's memory: "
                             f"at least {CONTROL_PLANE_MIN_MEMORY_MIB} MiB")
        return v


class NodePoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "batch", "count": 2, "cores": 4, "memory_mib": 8192, "disk_gib": 50}]})

    name: StrictStr = Field(pattern=POOL_NAME, description="lower case, 1-28 chars, not 'cp'",
                            json_schema_extra={"not": {"const": "cp"}})
    count: StrictInt = Field(ge=0, le=MAX_POOL_COUNT)
    cores: StrictInt = Field(2, ge=1, le=64)
    memory_mib: StrictInt = Field(4096, ge=512, le=1048576)
    disk_gib: StrictInt = Field(30, ge=10, le=65536)

    @field_validator("name")
    @classmethod
    def _not_cp(cls, v: str) -> str:
        if v == "cp":
            raise ValueError("'cp' names the control plane's members (cp-0, cp-1, …); choose another pool name")
        return v


class ClusterCreate(BaseModel):
    """``POST /v1/clusters``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "prod", "region": "dev-1", "version": "1.33",
        "control_plane": {"count": 3, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
        "node_pools": [{"name": "workers", "count": 2, "cores": 4, "memory_mib": 8192, "disk_gib": 50}]}]})

    name: StrictStr = Field(pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    version: Literal[VERSIONS] = Field(description="Kubernetes minor version")  # type: ignore[valid-type]
    image: StrictStr | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                    description="template the members are cloned from: one carrying the asked Kubernetes minor "
                                                "(default: the region's first image that does, `GET /v1/images`)")
    control_plane: ControlPlaneSpec
    node_pools: list[NodePoolSpec] = Field(default_factory=list, max_length=MAX_POOLS)
    address_pool: StrictStr | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
                                           description="the IPv4 pool of the control-plane endpoint")
    labels: schemas.Labels | None = Field(None, description="labels (GET /v1/clusters?label_selector=…)")


class ClusterPatch(BaseModel):
    """``PATCH /v1/clusters/{id}``: labels (replacing all of them). Database only, no job."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"labels": {"env": "prod"}}]})

    labels: schemas.Labels


class ResizePool(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"pool": "workers", "count": 4}]})

    pool: StrictStr = Field(pattern=POOL_NAME)
    count: StrictInt = Field(ge=0, le=MAX_POOL_COUNT)


class RemovePool(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"pool": "workers"}]})

    pool: StrictStr = Field(pattern=POOL_NAME)


class KubeconfigQuery(BaseModel):
    """``GET /v1/clusters/{id}/kubeconfig`` query parameters."""

    model_config = ConfigDict(extra="forbid")

    expiry_s: int | None = Field(None, ge=KUBECONFIG_EXPIRY_S[0], le=KUBECONFIG_EXPIRY_S[1],
                                 description="the client certificate's life in seconds "
                                                         f"({KUBECONFIG_EXPIRY_S[0]} to {KUBECONFIG_EXPIRY_S[1]}; default 3600)")


class Endpoint(schemas.Response):
    address_id: str | None
    address: str | None
    port: int
    url: str | None


class ControlPlaneView(schemas.Response):
    count: int
    cores: int
    memory_mib: int
    disk_gib: int
    ready: int


class NodePoolView(schemas.Response):
    name: str
    count: int
    cores: int
    memory_mib: int
    disk_gib: int
    ready: int


class ClusterMember(schemas.Response):
    """One VM of a cluster (a control-plane or worker node)."""

    name: str = Field(description="cp-<i> or <pool>-<i>: stable ordinals")
    role: Literal["control-plane", "worker"] | None
    pool: str | None
    vmid: int | None
    node: str | None
    address: str | None
    power_state: str | None
    ready: bool = Field(description="its Kubernetes node is Ready (seen inside the control plane)")


class ClusterPublic(schemas.Response):
    """A Kubernetes cluster (``GET /v1/clusters/{id}``)."""

    id: str = Field(pattern=r"^k8s_[0-9a-z]{26}$")
    name: str
    region: str
    version: str
    image: str
    labels: dict[str, str]
    status: Literal[STATUSES]  # type: ignore[valid-type]
    status_reason: str | None
    endpoint: Endpoint
    control_plane: ControlPlaneView
    node_pools: list[NodePoolView]
    members: list[ClusterMember]
    kubeconfig_available: bool
    observed_at: str | None
    created_at: str
    updated_at: str
    deleted_at: str | None


class Kubeconfig(schemas.Response):
    kubeconfig: str = Field(description="YAML; save it and use `kubectl --kubeconfig`")
    expires_at: str
    user: str
    serial: str = Field(description="the client certificate's serial number (hex), as listed by "
                                    "GET /v1/clusters/{id}/credentials")


class Credential(schemas.Response):
    serial: str = Field(description="the client certificate's serial number (hex)")
    user: str = Field(description="its CN (group kubeadm:cluster-admins)")
    token_id: str | None = Field(description="the API token that minted it")
    created_at: str
    expires_at: str
    trusted: bool = Field(description="the cluster's API servers accept it: not expired and minted after the "
                                      "last rotate-credentials")


class CredentialList(schemas.Response):
    """``GET /v1/clusters/{id}/credentials``: the kubeconfigs minted for the cluster, newest first."""

    credentials: list[Credential]


class CredentialsQuery(BaseModel):
    """``GET /v1/clusters/{id}/credentials`` query parameters."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=500, description="at most this many, newest first")


class RotateCredentials(BaseModel):
    """``POST /v1/clusters/{id}/actions/rotate-credentials`` (no fields)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{}]})


def _ts(v: Any) -> str:
    return v.isoformat().replace("+00:00", "Z")


EXAMPLE: dict[str, Any] = {
    "id": "k8s_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "prod", "region": "dev-1", "version": "1.33",
    "image": "debian-12", "labels": {}, "status": "creating", "status_reason": None,
    "endpoint": {"address_id": "adr_01jd3x5v8q2m6n4p7r9s1t3w60", "address": "203.0.113.10", "port": 6443,
                 "url": "https://203.0.113.10:6443"},
    "control_plane": {"count": 3, "cores": 2, "memory_mib": 4096, "disk_gib": 30, "ready": 0},
    "node_pools": [{"name": "workers", "count": 2, "cores": 4, "memory_mib": 8192, "disk_gib": 50, "ready": 0}],
    "members": [], "kubeconfig_available": False, "observed_at": None,
    "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z", "deleted_at": None,
}


def installation_key(settings: Settings) -> pki.InstallationKey:
    """The installation key (503 naming the setting when it is missing or malformed)."""
    if settings.installation_key is None:
        raise InstallationKeyMissing("Z9_INSTALLATION_KEY is not set: clusters' keys cannot be sealed or opened "
                                     "(`z9 dev` generates one; see the README)")
    try:
        return pki.InstallationKey.parse(settings.installation_key.get_secret_value())
    except pki.SealError as e:
        raise InstallationKeyMissing(str(e)) from e


def check(settings: Settings, spec: ClusterCreate) -> None:
    """422s before database work: pool names unique, the image offered in the region."""
    names = [p.name for p in spec.node_pools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValidationFailed(f"node_pools: pool name {dup[0]!r} is used twice",
                               details=[{"field": "node_pools", "message": "duplicate pool name"}])
    region = settings.regions[spec.region]
    if spec.image is not None and region.images and spec.image not in region.images:
        raise ValidationFailed(f"image: {spec.image!r} is not offered in region {spec.region}",
                               details=[{"field": "image", "message": "unknown image"}])
    kubernetes_image(settings, spec)
    installation_key(settings)


def kubernetes_image(settings: Settings, spec: ClusterCreate) -> tuple[str, str]:
    """``(image, release)`` the cluster is built from: the image of the region's catalogue
    (``kubernetes_images``) carrying the asked minor — the named one, or the first — else 422.

    The image's kubeadm and kubelet are the cluster's: kubeadm deploys a control plane of its own
    minor or one behind (``MinimumControlPlaneVersion = getSkewedKubernetesVersion(-1)``,
    cmd/kubeadm/app/constants/constants.go; ``NormalizeKubernetesVersion``, cmd/kubeadm/app/util/
    config/common.go: "this version of kubeadm only supports deploying clusters with the control
    plane version >= …") and its preflight refuses a kubelet newer than the control plane
    (``KubeletVersionCheck``, cmd/kubeadm/app/preflight/checks.go; the Version Skew Policy: "kubelet
    must not be newer than kube-apiserver"). An image of another minor fails late (cloud-init's
    error on the first member) or builds a cluster of another version than asked: refused here."""
    region = settings.regions[spec.region]
    picked = region.kubernetes_image(spec.version, spec.image)
    if picked is not None:
        return picked
    if spec.image is not None:
        carried = region.kubernetes_images.get(spec.image)
        why = (f"it carries Kubernetes {carried}" if carried else
               "the region's catalogue (kubernetes_images) names no Kubernetes release for it")
        raise ValidationFailed(f"image: {spec.image!r} cannot build a Kubernetes {spec.version} cluster: {why}",
                               details=[{"field": "image", "message": f"no Kubernetes {spec.version} in this image"}])
    offered = ", ".join(f"{r} ({i})" for i, r in region.kubernetes_images.items()) or "none"
    raise ValidationFailed(f"version: no image of region {spec.region} carries Kubernetes {spec.version} "
                           f"(its cluster images carry: {offered})",
                           details=[{"field": "version", "message": f"no image of the region carries {spec.version}"}])


def member_totals(control_plane: dict[str, Any], node_pools: list[dict[str, Any]]) -> tuple[int, int]:
    """(cores, memory_mib) of every member VM of a cluster of this shape — what it counts against
    the tenant's ``cores`` and ``memory_mib`` quotas (like servers; the ``servers`` quota counts
    servers only, and the endpoint counts as one address)."""
    groups = [control_plane, *node_pools]
    return (sum(int(g["count"]) * int(g["cores"]) for g in groups),
            sum(int(g["count"]) * int(g["memory_mib"]) for g in groups))



async def _live_cluster_for_update(conn: Any, rid: str, tenant_id: str) -> Cluster:
    """The tenant's cluster, its row locked until commit: 404 when there is none, 409
    ``resource_deleting`` while it is being deleted (the precondition of every cluster action)."""
    cluster = await cluster_store.cluster_get_for_update(conn, rid, tenant_id)
    if cluster is None:
        raise NotFound(f"no cluster {rid!r}")
    if cluster.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"cluster {rid} is {cluster.status}", **deleting("cluster", rid, cluster.status))
    return cluster

async def create(ctx: CreateContext, spec: ClusterCreate) -> tuple[Cluster, dict[str, Any]]:
    """Cluster row, sealed PKI, endpoint address and ClusterCreate job, in the API transaction."""
    key = installation_key(ctx.settings)
    cores, memory_mib = member_totals(spec.control_plane.model_dump(), [p.model_dump() for p in spec.node_pools])
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, cores=cores, memory_mib=memory_mib, addresses=1)
    image, _release = kubernetes_image(ctx.settings, spec)
    cid = new_id("k8s")
    pool = await addresses.pick_pool(ctx.conn, ctx.settings, spec.region, 4, spec.address_pool,
                                     field="address_pool", family_field="region")
    # its endpoint address counts against the tenant's address quota (as the usage counts it)
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, addresses=1)
    address = await address_store.address_allocate(ctx.conn, pool_id=pool["id"], tenant_id=ctx.tenant_id, kind="floating",
                                           name=None, protect_delete=True)
    if address is None:
        raise addresses.exhausted(pool)
    await cluster_store.cluster_endpoint_activate(ctx.conn, address.id)
    try:
        cluster = await cluster_store.cluster_insert(
            ctx.conn, cluster_id=cid, tenant_id=ctx.tenant_id, region=spec.region, name=spec.name,
            version=spec.version, image=image, control_plane=spec.control_plane.model_dump(),
            node_pools=[p.model_dump() for p in spec.node_pools], endpoint_address_id=address.id,
            endpoint_ip=str(address.ip), labels=spec.labels)
    except UniqueViolation as e:
        if e.constraint != "clusters_tenant_name_live":
            raise
        raise Conflict(f"a cluster named {spec.name!r} already exists in this tenant; "
                       "choose another name or delete that cluster first", code="uniqueness_error") from e
    await cluster_store.cluster_keys_insert(ctx.conn, cid, *key.seal(cid, pki.new_cluster_pki()))
    job = await store.job_insert(ctx.conn, CLUSTER.new_job(cluster, CLUSTER_CREATE,
                                                           max_attempts=ctx.settings.max_attempts), notify=False)
    return cluster, job.brief()


def actions(api: ApiResource) -> list[Operation]:
    """The kubeconfig route, PATCH (labels) and the node-pool actions."""
    accepted, one = api.models["accepted"], api.models["one"]
    id_doc = "the cluster's id (k8s_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5z", "status": "pending"}

    async def kubeconfig(request: web.Request) -> web.Response:
        from z9.api.tokens import PRINCIPAL

        settings, pool = request.app[SETTINGS], request.app[POOL]
        principal = request[PRINCIPAL]
        if "write" not in principal.scopes:  # a cluster-admin credential: not a read
            raise Forbidden(f"this token has scopes {','.join(sorted(principal.scopes))}: minting a kubeconfig (a "
                            "cluster-admin credential) needs the write scope", code="insufficient_scope",
                            details=[{"scope": "write"}])
        rid = path_id(request, "k8s", "cluster")
        raw = request.query.get("expiry_s", "3600")
        # digits only: int() also takes "6_00", " 600", "+600" and other scripts' digits
        expiry_s = int(raw) if re.fullmatch(r"[0-9]{1,9}", raw) else -1
        if not KUBECONFIG_EXPIRY_S[0] <= expiry_s <= KUBECONFIG_EXPIRY_S[1]:
            raise ValidationFailed(f"expiry_s: must be an integer from {KUBECONFIG_EXPIRY_S[0]} to "
                                   f"{KUBECONFIG_EXPIRY_S[1]} seconds, got {raw!r}",
                                   details=[{"field": "expiry_s", "message": "out of range"}])
        if expiry_s > settings.kubeconfig_max_expiry_s:
            raise ValidationFailed(f"expiry_s: {expiry_s} is past this installation's longest kubeconfig, "
                                   f"Z9_KUBECONFIG_MAX_EXPIRY_S ({settings.kubeconfig_max_expiry_s} seconds)",
                                   details=[{"field": "expiry_s", "message": "past Z9_KUBECONFIG_MAX_EXPIRY_S",
                                             "max": settings.kubeconfig_max_expiry_s}])
        if principal.expires_at is not None:  # never past the minting token's own expiry
            left = int((principal.expires_at - clock_of(request.app).now()).total_seconds())
            expiry_s = max(1, min(expiry_s, left))
        key = installation_key(settings)
        cluster = await CLUSTER.get(pool, rid, tenant(request))
        if cluster is None:
            raise NotFound(f"no cluster {rid!r}")
        if cluster.status in ("destroying", "deleted"):
            raise Conflict(f"cluster {rid} is {cluster.status}", **deleting("cluster", rid, cluster.status))
        if cluster.initialized_at is None:
            raise Conflict(f"cluster {rid} has not been ready yet (status {cluster.status}); a kubeconfig is "
                           "available once every member first was a Ready node", code="cluster_not_ready")
        sealed = await cluster_store.cluster_keys_get(pool, rid)
        if sealed is None:
            raise Conflict(f"cluster {rid} has no keys", **deleting("cluster", rid, cluster.status))
        try:
            material = key.open(rid, *sealed)
        except pki.SealError as e:  # another installation key than the one that sealed them
            raise InstallationKeyMissing(f"{e}: Z9_INSTALLATION_KEY must be the key the cluster was created "
                                         "with") from e
        user = f"z9-admin-{secrets.token_hex(4)}"
        # signed by the users' client CA (rotatable), or the cluster CA for a cluster older than it
        ca = "client-ca" if "client-ca.key" in material else "ca"
        crt, k, not_after = pki.client_certificate(material[f"{ca}.crt"], material[f"{ca}.key"], cn=user,
                                                   orgs=("kubeadm:cluster-admins",), expiry_s=expiry_s)
        serial = pki.serial_hex(crt)
        await cluster_store.cluster_credential_insert(pool, serial=serial, cluster_id=rid, tenant_id=cluster.tenant_id,
                                              token_id=principal.token_id, username=user, expires_at=not_after)
        text = pki.kubeconfig(cluster.name, cluster.endpoint() or "", material["ca.crt"], crt, k, user)
        body = {"kubeconfig": text, "expires_at": not_after.isoformat().replace("+00:00", "Z"), "user": user,
                "serial": serial}
        return web.json_response(dump(Kubeconfig, body), headers={"Cache-Control": "no-store"})

    async def credentials(request: web.Request) -> web.Response:
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "k8s", "cluster")
        if await CLUSTER.get(pool, rid, tenant_id) is None:
            raise NotFound(f"no cluster {rid!r}")
        rows = await cluster_store.cluster_credential_list(pool, rid, tenant_id, limit_param(request))
        return web.json_response(dump(CredentialList, {"credentials": [
            {"serial": r["serial"], "user": r["username"], "token_id": r["token_id"], "created_at": _ts(r["created_at"]),
             "expires_at": _ts(r["expires_at"]), "trusted": r["trusted"]} for r in rows]}))

    async def rotate(request: web.Request) -> web.Response:
        await parse_body(request, RotateCredentials)
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        rid = path_id(request, "k8s", "cluster")
        ikey = installation_key(settings)
        key = idempotency_key(request)
        req_hash = request_hash("POST /clusters/{id}/actions/rotate-credentials", [rid])
        async with pool.acquire() as conn, conn.transaction():
            replay = await idempotency_begin(conn, tenant_id, key, req_hash)
            if replay is not None:
                return replay
            cluster = await _live_cluster_for_update(conn, rid, tenant_id)
            sealed = await cluster_store.cluster_keys_get_for_update(conn, rid)
            if sealed is None:
                raise Conflict(f"cluster {rid} has no keys", **deleting("cluster", rid, cluster.status))
            try:
                material = ikey.open(rid, *sealed)
            except pki.SealError as e:
                raise InstallationKeyMissing(f"{e}: Z9_INSTALLATION_KEY must be the key the cluster was created "
                                             "with") from e
            if "client-ca.key" not in material:
                raise Conflict(f"cluster {rid} was made before z9 gave kubeconfigs a client CA of their own: its "
                               "kubeconfigs are signed by the cluster CA, which rotate-credentials does not replace",
                               code="client_ca_unsupported")
            material["client-ca.crt"], material["client-ca.key"] = pki.new_client_ca()
            await cluster_store.cluster_keys_rotate(conn, rid, *ikey.seal(rid, material))
            await room_for_a_job(conn, settings, "cluster", rid)
            bundle = pki.client_ca_bundle(material) or ""
            job = await store.job_insert(conn, CLUSTER.new_job(
                cluster, CLUSTER_RECONCILE, max_attempts=settings.max_attempts,
                args={"client_ca": hashlib.sha256(bundle.encode()).hexdigest()[:16]}), notify=False)
            answer = dump(accepted, {"cluster": cluster.public(), "job": job.brief()})
            await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(answer, status=202)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, ClusterPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "k8s", "cluster")
        row = await cluster_store.cluster_set_labels(pool, rid, tenant_id, spec.labels)
        if row is None:
            if await CLUSTER.get(pool, rid, tenant_id) is None:
                raise NotFound(f"no cluster {rid!r}")
            raise Conflict(f"cluster {rid} is deleted; it cannot be changed", **deleting("cluster", rid, "deleted"))
        return web.json_response(dump(one, {"cluster": row.public()}))

    async def _action(request: web.Request, route: str, body: Any, fn: Any) -> web.Response:
        async def change(conn: Any, settings: Settings, tenant_id: str, rid: str) -> Any:
            cluster = await _live_cluster_for_update(conn, rid, tenant_id)
            pools = fn([dict(p) for p in cluster.node_pools])
            before = member_totals(cluster.control_plane, cluster.node_pools)
            after = member_totals(cluster.control_plane, pools)
            await quotas.check(conn, settings, tenant_id, cores=after[0] - before[0],
                               memory_mib=after[1] - before[1])
            return await cluster_store.cluster_set_shape(conn, rid, pools), CLUSTER_RECONCILE, None, ()

        return await action_transaction(request, CLUSTER, route, body, change, accepted=accepted)

    def _find(pools: list[dict[str, Any]], name: str) -> dict[str, Any]:
        for p in pools:
            if p["name"] == name:
                return p
        raise ValidationFailed(f"pool: the cluster has no node pool {name!r} (pools: "
                               f"{', '.join(p['name'] for p in pools) or 'none'})",
                               details=[{"field": "pool", "message": "unknown pool"}])

    async def add_pool(request: web.Request) -> web.Response:
        spec = await parse_body(request, NodePoolSpec)

        def fn(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if any(p["name"] == spec.name for p in pools):
                raise Conflict(f"the cluster already has a node pool named {spec.name!r}", code="uniqueness_error")
            if len(pools) >= MAX_POOLS:  # the cluster's state, not the body: 409 (as a load balancer's)
                raise Conflict(f"the cluster has {len(pools)} node pools, the most a cluster has ({MAX_POOLS}); "
                               "remove one first", code="resource_limit_exceeded")
            return pools + [spec.model_dump()]

        return await _action(request, "POST /clusters/{id}/actions/add-node-pool", spec.model_dump(), fn)

    async def resize_pool(request: web.Request) -> web.Response:
        spec = await parse_body(request, ResizePool)

        def fn(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
            _find(pools, spec.pool)["count"] = spec.count
            return pools

        return await _action(request, "POST /clusters/{id}/actions/resize-node-pool", spec.model_dump(), fn)

    async def remove_pool(request: web.Request) -> web.Response:
        spec = await parse_body(request, RemovePool)

        def fn(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
            gone = _find(pools, spec.pool)
            return [p for p in pools if p is not gone]

        return await _action(request, "POST /clusters/{id}/actions/remove-node-pool", spec.model_dump(), fn)

    example = {"cluster": {**EXAMPLE, "status": "updating"}, "job": {**job_ref, "kind": CLUSTER_RECONCILE}}
    errors: dict[int, Any] = {400: None, 401: None, 404: None, 409: None, 422: None}
    return [
        Operation("GET", "/clusters/{id}/kubeconfig", kubeconfig, "getClusterKubeconfig",
                  "A kubeconfig with a freshly minted client certificate (query expiry_s, default 3600; needs the "
                  "write scope; recorded)",
                  "clusters", {200: Kubeconfig, 401: None, 403: None, 404: None, 409: None, 422: None, 503: None},
                  path_id=id_doc, query=KubeconfigQuery, example={"kubeconfig": "apiVersion: v1\nkind: Config\n...",
                                           "expires_at": "2026-12-01T05:00:00Z", "user": "z9-admin-1a2b3c4d",
                                           "serial": "5c1d9e0f3a7b2c4d"}),
        Operation("GET", "/clusters/{id}/credentials", credentials, "listClusterCredentials",
                  "The kubeconfigs minted for the cluster (who, when, until when, serial, still trusted)", "clusters",
                  {200: CredentialList, 401: None, 404: None, 422: None}, path_id=id_doc, query=CredentialsQuery,
                  example={"credentials": [{"serial": "5c1d9e0f3a7b2c4d", "user": "z9-admin-1a2b3c4d",
                                            "token_id": "tok_01jd3x5v8q2m6n4p7r9s1t3w60",
                                            "created_at": "2026-12-01T04:00:00Z", "expires_at": "2026-12-01T05:00:00Z",
                                            "trusted": True}]}),
        Operation("POST", "/clusters/{id}/actions/rotate-credentials", rotate, "rotateClusterCredentials",
                  "A new client CA for kubeconfigs: every kubeconfig minted before stops working (202 + "
                  "ClusterReconcile)", "clusters", {202: accepted, **errors, 503: None},
                  request=RotateCredentials, path_id=id_doc, idempotent=True, example=example),
        Operation("PATCH", "/clusters/{id}", patch, "updateCluster", "Set a cluster's labels (no job)", "clusters",
                  {200: one, 400: None, 401: None, 404: None, 409: None, 422: None}, request=ClusterPatch,
                  path_id=id_doc, example={"cluster": {**EXAMPLE, "labels": {"env": "prod"}}}),
        Operation("POST", "/clusters/{id}/actions/add-node-pool", add_pool, "addClusterNodePool",
                  "Add a node pool (202 + ClusterReconcile)", "clusters", {202: accepted, **errors},
                  request=NodePoolSpec, path_id=id_doc, idempotent=True, example=example),
        Operation("POST", "/clusters/{id}/actions/resize-node-pool", resize_pool, "resizeClusterNodePool",
                  "Resize a node pool; scale-down drains and removes the highest ordinals first", "clusters",
                  {202: accepted, **errors}, request=ResizePool, path_id=id_doc, idempotent=True, example=example),
        Operation("POST", "/clusters/{id}/actions/remove-node-pool", remove_pool, "removeClusterNodePool",
                  "Remove a node pool (its members drained and removed, highest ordinal first)", "clusters",
                  {202: accepted, **errors}, request=RemovePool, path_id=id_doc, idempotent=True, example=example),
    ]


API = ApiResource(rtype=CLUSTER, create_model=ClusterCreate, public_model=ClusterPublic, create=create,
                  check=check, example=EXAMPLE, transactional=True, actions=actions,
                  tag_description="Kubernetes clusters: control plane and node pools as one resource, deleted at once")
