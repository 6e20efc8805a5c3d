"""Installation settings: one pydantic-settings model, every variable prefixed ``Z9_``.

Built once in each service's ``main`` and passed down; nothing here is created at import time.
Nested values (``Z9_REGIONS``) are JSON, e.g.::

    Z9_REGIONS='{"dev-1": {"url": "https://127.0.0.1:8006", "token_id": "root@pam!z9",
                 "token_secret": "…", "verify_ssl": false, "images": ["debian-12"]}}'

Defaults follow the architecture notes (§5): backoff base 2 s, cap 300 s, jitter ±25 %,
10 attempts, lease TTL 30 s, heartbeat 10 s, deletion buffer 600 s, retention 7 days.
"""
from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import os
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_POOL_SIZE = 65536  # addresses per pool range: every allocatable IP has a row (db migration 0005)


def dsn_problem(dsn: str) -> str | None:
    """Why asyncpg cannot use the connection string ``dsn`` (None: it can try): the scheme, a
    host's port (out of range or not a number: asyncpg raises ``OverflowError``/``ValueError``
    while connecting, which read as a crash), a broken IPv6 bracket. Never quotes ``dsn`` (it may
    hold a password)."""
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
    except ValueError as e:
        return f"not a connection string ({e})"
    if parts.scheme not in ("postgresql", "postgres"):
        return "must start with postgresql:// or postgres://"
    ports = [p for v in query.get("port", []) for p in v.split(",")]
    hosts = parts.netloc.rpartition("@")[2]
    for spec in hosts.split(",") if hosts else []:
        if spec.startswith("["):
            _, bracket, rest = spec[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                return "an IPv6 host must be written [address]:port"
            ports.append(rest[1:])
        elif ":" in spec:
            ports.append(spec.rpartition(":")[2])
    for port in ports:
        port = unquote(port)
        if port and (not port.isdigit() or not 1 <= int(port) <= 65535):
            return f"port {port!r} is not a number from 1 to 65535"
    return None


def read_secret_file(path: Path) -> str | None:
    """The stripped content of a secret file (a mounted Kubernetes/Compose secret), or None when
    this process does not have it (not given to this service)."""
    try:
        return Path(path).read_text().strip() or None
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
        return None


class AddressPoolSettings(BaseModel):
    """One address pool of a region (``Z9_REGIONS[r].address_pools``), e.g.::

        {"name": "public", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
         "range": ["203.0.113.10", "203.0.113.250"], "reserved": ["203.0.113.53"],
         "bridge": "vmbr0", "vlan": null, "nameservers": ["203.0.113.53"]}

    ``family`` is taken from ``cidr``. ``range`` (first, last) is the allocatable part of the
    network (default: every host address; the gateway and ``reserved`` are never handed out);
    at most 65,536 addresses. ``bridge``/``vlan`` say how a VM's ``net0`` reaches the network;
    ``nameservers`` go to cloud-init with a primary address. A released address is not handed
    out again for ``quarantine_s`` seconds.
    """

    model_config = {"extra": "forbid", "frozen": True}

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    cidr: IPNetwork
    gateway: IPAddr | None = None
    range: tuple[IPAddr, IPAddr] | None = None
    reserved: list[IPAddr] = Field(default_factory=list)
    bridge: str = Field("vmbr0", pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,15}$")
    vlan: int | None = Field(None, ge=1, le=4094)
    nameservers: list[IPAddr] = Field(default_factory=list)
    quarantine_s: int = Field(3600, ge=0)

    @field_validator("cidr", mode="before")
    @classmethod
    def _strict_network(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                return ipaddress.ip_network(v, strict=True)
            except ValueError as e:
                raise ValueError(f"{v!r} is not a network address with its prefix ({e})") from None
        return v

    @property
    def family(self) -> int:
        return self.cidr.version

    @property
    def first_last(self) -> tuple[IPAddr, IPAddr]:
        """The allocatable range: ``range``, or every host address of ``cidr``."""
        if self.range is not None:
            return self.range
        net = self.cidr
        if net.num_addresses <= 2:
            return net[0], net[-1]
        if net.version == 4:
            return net[1], net[-2]
        return net[1], net[-1]

    @model_validator(mode="after")
    def _inside(self) -> "AddressPoolSettings":
        net = self.cidr
        for label, ip in [("gateway", self.gateway), *[("reserved", r) for r in self.reserved],
                          *([("range", r) for r in self.range] if self.range else [])]:
            if ip is not None and (ip.version != net.version or ip not in net):
                raise ValueError(f"pool {self.name!r}: {label} {ip} is not inside {net}")
        first, last = self.first_last
        if first > last:
            raise ValueError(f"pool {self.name!r}: range starts after it ends ({first} > {last})")
        if int(last) - int(first) + 1 > MAX_POOL_SIZE:
            raise ValueError(f"pool {self.name!r}: range {first}-{last} holds more than {MAX_POOL_SIZE} "
                             "addresses; split it into several pools")
        for ns in self.nameservers:
            if ns.version != net.version:
                raise ValueError(f"pool {self.name!r}: nameserver {ns} is not IPv{net.version}")
        return self


class PrivateNetworkSettings(BaseModel):
    """A region's private network (``Z9_REGIONS[r].private_network``), e.g.::

        {"cidr": "172.16.0.0/16", "gateway": "172.16.0.1", "nameservers": ["172.16.0.53"]}

    Every guest z9 makes without an address of its own from a pool (a server without a primary
    address, a Kubernetes cluster's members) gets one IPv4 address from it, chosen by z9 — not
    leased by a DHCP server z9 cannot see — written as the VM's static cloud-init network and as the
    only address its Proxmox IP filter lets it send from (``ipfilter-net0``). ``range`` (first,
    last) is the allocatable part (default: every host address but the gateway); ``reserved`` are
    never handed out; a released address comes back after ``quarantine_s``. IPv4 only, at most
    65,536 addresses. The network is the region's (shared by its tenants, as the bridge is): what
    keeps tenants apart on it is the IP filter, not the addressing.
    """

    model_config = {"extra": "forbid"}

    cidr: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address | None = None
    range: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None = None
    reserved: list[ipaddress.IPv4Address] = Field(default_factory=list)
    nameservers: list[ipaddress.IPv4Address] = Field(default_factory=list)
    quarantine_s: int = Field(600, ge=0)

    @field_validator("cidr", mode="before")
    @classmethod
    def _strict_network(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                return ipaddress.IPv4Network(v, strict=True)
            except ValueError as e:
                raise ValueError(f"{v!r} is not an IPv4 network address with its prefix ({e})") from None
        return v

    @property
    def first_last(self) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        if self.range is not None:
            return self.range
        net = self.cidr
        return (net[0], net[-1]) if net.num_addresses <= 2 else (net[1], net[-2])

    @property
    def excluded(self) -> list[ipaddress.IPv4Address]:
        """Never handed out: the gateway and ``reserved``."""
        return [*([self.gateway] if self.gateway else []), *self.reserved]

    @model_validator(mode="after")
    def _inside(self) -> "PrivateNetworkSettings":
        net = self.cidr
        for label, ip in [("gateway", self.gateway), *[("reserved", r) for r in self.reserved],
                          *([("range", r) for r in self.range] if self.range else [])]:
            if ip is not None and ip not in net:
                raise ValueError(f"private_network: {label} {ip} is not inside {net}")
        first, last = self.first_last
        if first > last:
            raise ValueError(f"private_network: range starts after it ends ({first} > {last})")
        if int(last) - int(first) + 1 > MAX_POOL_SIZE:
            raise ValueError(f"private_network: range {first}-{last} holds more than {MAX_POOL_SIZE} addresses")
        return self

    def ipconfig0(self, ip: str) -> str:
        """PVE's cloud-init ``ipconfig0`` for ``ip`` on this network."""
        return f"ip={ip}/{self.cidr.prefixlen}" + (f",gw={self.gateway}" if self.gateway else "")


# a Kubernetes release as z9 keeps it (kubeadm's kubernetesVersion is it with a leading v)
KUBERNETES_RELEASE = re.compile(r"1\.(?:[0-9]|[1-9][0-9])\.(?:0|[1-9][0-9]*)")


class SdnZoneSettings(BaseModel):
    """The Proxmox SDN zone z9 keeps a region's private networks in (one VNet per network; z9 creates
    the zone itself, under the id ``zone``). ``type`` ``vxlan`` (the default: L2 over UDP between
    ``peers``, the nodes' addresses; no switch to configure) or ``vlan`` (on the Linux bridge ``bridge``,
    its tags carried by the switch). ``mtu``: the zone's (default PVE's — a VXLAN zone 1450, the
    uplink's 1500 − 50 —, a VLAN zone 1500); every guest NIC on a network is given it (the NIC's
    ``mtu``, set in the guest). ``tags``: the VXLAN ids (VLAN tags) z9 hands its networks, a range no
    other VNet of the cluster uses (pve-network refuses a VNI twice across every VXLAN zone)."""

    model_config = {"extra": "forbid", "frozen": True}

    zone: str = Field("z9net", pattern=r"^[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]$", min_length=2, max_length=8)
    type: Literal["vxlan", "vlan"] = "vxlan"
    peers: list[IPAddr] = Field(default_factory=list)
    bridge: str | None = Field(None, min_length=1, max_length=15)
    mtu: int | None = Field(None, ge=1280, le=65520)
    tags: tuple[int, int] = (100000, 199999)

    @model_validator(mode="after")
    def _complete(self) -> "SdnZoneSettings":
        if self.type == "vxlan" and not self.peers:
            raise ValueError("sdn: a vxlan zone needs its peers (the nodes' addresses)")
        if self.type == "vlan" and not self.bridge:
            raise ValueError("sdn: a vlan zone needs its bridge")
        first, last = self.tags
        top = 16777215 if self.type == "vxlan" else 4094
        if not 1 <= first <= last <= top:
            raise ValueError(f"sdn: tags {first}-{last} is not a range within 1-{top}")
        return self

    @property
    def guest_mtu(self) -> int:
        """The MTU a guest NIC on the zone needs (pve-network VxlanPlugin.pm: 1450 unless set)."""
        return self.mtu or (1450 if self.type == "vxlan" else 1500)


class RegionSettings(BaseModel):
    """One region = one Proxmox VE cluster.

    ``url`` is the API endpoint (``https://host:8006``); ``token_id`` is ``USER@REALM!TOKENID`` and
    ``token_secret`` its secret (Proxmox API token auth). ``verify_ssl`` is a bool or the path of
    a CA bundle. ``images`` lists the template names the API accepts for this region (empty: any
    name; the executor then finds out whether the template exists). ``request_timeout_s`` bounds
    one HTTP request to Proxmox (seconds). ``resources_snapshot_s`` is how old the executor
    process's shared ``/cluster/resources`` snapshot may be (seconds; every job of the process reads
    it instead of listing the cluster itself, and confirms each VM by its own config).
    ``resources_snapshot_create_s`` is how old it may be for the lookups of a create and of a
    template, which have an authority of their own for "none": a create's clone ledger names every
    VM z9 cloned for the member (each read on its node), a template's own config decides (none found
    in an older snapshot makes a listing newer than the job's claim). Issue 13: at 10,000 VMs a
    listing costs 30–50 ms of executor CPU; creates at 2 s cost ×1.3 the CPU of a 100-VM region.
    ``max_concurrent_jobs`` caps the region's running jobs across every executor process serving
    it (the hypervisor, not z9, is the limit): a claim takes a per-region lock, counts the region's
    running jobs whose lease has not expired and claims at most the difference. Unset (``null``):
    no cap, and the claim does none of that. Every executor of the region must carry the same value.
    """

    model_config = {"frozen": True}

    url: str
    token_id: str = "root@pam!z9"
    # The token's secret — only the executor uses it (docs/settings.md, "Which service needs which
    # secret"): give it inline to the executor only, or name a file (a mounted secret) that only
    # the executor's container has; a service without it never talks to Proxmox.
    token_secret: SecretStr | None = None
    token_secret_file: Path | None = None
    verify_ssl: bool | str = True
    images: list[str] = Field(default_factory=list)
    image_disk_gib: dict[str, float] = Field(default_factory=dict, description=(
        "each image's boot disk size in GiB, as its template has it (e.g. `{\"debian-12\": 2}`): a server asking for a "
        "smaller `disk_gib` is refused at the request (422 naming `disk_gib`) rather than accepted and failed by its "
        "job (disks cannot shrink); an image not listed is checked by the job only. `GET /v1/images` shows it"))
    kubernetes_images: dict[str, str] = Field(default_factory=dict, description=(
        "the Kubernetes release each cluster image carries — its kubeadm, kubelet and kubectl, as its builder "
        "installed them (e.g. `{\"debian-12-k8s-1.33\": \"1.33.5\"}`): a cluster's `version` picks the first image "
        "of that minor (or its `image` must carry that minor), its kubeadm config asks for exactly that release "
        "(`kubernetesVersion`), and a version no image carries is refused at the request (422 naming `version`). "
        "Members check the binaries they boot with against it"))
    request_timeout_s: float = 10.0
    resources_snapshot_s: float = Field(2.0, ge=0.0, le=60.0)
    resources_snapshot_create_s: float = Field(30.0, ge=0.0, le=600.0)
    max_concurrent_jobs: int | None = Field(None, ge=1)
    address_pools: list[AddressPoolSettings] = Field(default_factory=list)
    # the operator-provided template that load balancer appliances are cloned from (HAProxy,
    # keepalived and the QEMU guest agent installed; agent enabled; a cloud-init drive)
    lb_image: str = "z9-lb-appliance"
    # volumes: the storage their disks are made on (one every node sees, shared — e.g. Ceph RBD — so a
    # volume attaches to a server on any node: qemu-server reassigns a disk only between VMs of one
    # node, and z9 moves the volume's config-only anchor VM to the server's node first), and the
    # largest size a volume may have (422 naming size_gib above it)
    volume_storage: str = Field("ceph-vm", min_length=1, max_length=63, description=(
        "the Proxmox storage volumes' disks are made on: one every node sees (shared, e.g. Ceph RBD), so a volume "
        "attaches to a server on any node"))
    volume_max_gib: int = Field(10240, ge=1, le=65536, description=(
        "the largest volume of the region, GiB (a larger `size_gib` is refused: 422 naming it)"))
    # Networks of the platform in this region (the region agent's network, the Proxmox nodes',
    # storage, management): never a load balancer's ip target, whatever else allows it. Every
    # address pool's network is refused as well (but for the tenant's own addresses in it).
    platform_networks: list[IPNetwork] = Field(default_factory=list)
    # Non-public networks a load balancer's ip target may be in (e.g. a tenant network routed to
    # the appliances). By default an ip target is a public unicast address only: RFC 1918,
    # 100.64/10 (shared), 198.18/15 (benchmarking) and every non-global range are refused.
    lb_target_private_networks: list[IPNetwork] = Field(default_factory=list)
    # The network every guest without a pool address of its own gets its address from, chosen by
    # z9 and enforced by the Proxmox IP filter (PrivateNetworkSettings). Unset: such guests take
    # DHCP from the bridge and z9 puts no IP filter on them (it cannot know their lease).
    private_network: PrivateNetworkSettings | None = None
    sdn: SdnZoneSettings | None = Field(None, description=(
        "the Proxmox SDN zone of the region's private networks (`POST /v1/networks`): `{\"type\": \"vxlan\", "
        "\"peers\": [node addresses]}` or `{\"type\": \"vlan\", \"bridge\": \"vmbr1\"}`, and `mtu`, `tags`, `zone`; "
        "unset: the region offers no networks (409 naming it)"))
    nameservers: list[IPAddr] = Field(default_factory=list, max_length=3, description=(
        "the DNS resolvers of the region's guests (at most 3: resolv.conf's MAXNS): written into every guest's "
        "network-config (cloud-init) — a server's, a load balancer's, a cluster member's — unless its own network "
        "(an address pool's or the private network's `nameservers`) names its own. A guest whose network names "
        "none has no DNS (its image pulls, package installs and the pod network fail): z9 fails its verify "
        "naming that"))

    @field_validator("kubernetes_images")
    @classmethod
    def _kubernetes_releases(cls, v: dict[str, str]) -> dict[str, str]:
        for image, release in v.items():
            if not KUBERNETES_RELEASE.fullmatch(str(release)):
                raise ValueError(f"kubernetes_images: {image!r} carries {release!r}, not a Kubernetes release "
                                 "MAJOR.MINOR.PATCH (as `kubelet --version` prints it, without the v)")
        return v

    def kubernetes_image(self, minor: str, image: str | None = None) -> tuple[str, str] | None:
        """``(image, release)`` of a cluster of Kubernetes ``minor`` (``1.33``): the named ``image``
        when it carries that minor, else (no image named) the first image of the catalogue that does;
        None when there is none."""
        for name, release in self.kubernetes_images.items():
            if (image is None or name == image) and release.rsplit(".", 1)[0] == minor:
                return name, release
        return None

    def guest_nameservers(self, own: Sequence[Any] = ()) -> list[str]:
        """The nameservers a guest is given: its network's own (``own``: the pool's or the private
        network's), else the region's."""
        return [str(n) for n in own] if own else [str(n) for n in self.nameservers]

    @model_validator(mode="before")
    @classmethod
    def _secret_from_file(cls, data: object) -> object:
        """``token_secret`` read from ``token_secret_file`` when only the file is named and this
        process has it (the executor); left unset otherwise (before validation: the model is
        frozen)."""
        if isinstance(data, dict) and data.get("token_secret") is None and data.get("token_secret_file"):
            secret = read_secret_file(Path(data["token_secret_file"]))
            if secret is not None:
                data = {**data, "token_secret": secret}
        return data

    def require_token_secret(self, region: str) -> str:
        """The token secret; ValueError naming the setting when this process was given none."""
        if self.token_secret is None:
            where = (f"its token_secret_file {str(self.token_secret_file)!r} is not readable here"
                     if self.token_secret_file else "it has neither token_secret nor token_secret_file")
            raise ValueError(f"Z9_REGIONS[{region}]: the Proxmox token secret is missing ({where}); the "
                             "executor needs it, and the API and the reaper to plan (they only read)")
        return self.token_secret.get_secret_value()

    @field_validator("url")
    @classmethod
    def _https_only(cls, v: str) -> str:
        if not v.startswith("https://"):
            raise ValueError("Proxmox VE is reached over HTTPS only (url must start with https://)")
        return v.rstrip("/")

    @field_validator("address_pools")
    @classmethod
    def _pools_apart(cls, pools: list[AddressPoolSettings]) -> list[AddressPoolSettings]:
        """Pool names are unique and pools do not overlap (the database refuses it too:
        ``address_pools_no_overlap``); the message names both pools."""
        for i, a in enumerate(pools):
            for b in pools[i + 1:]:
                if a.name == b.name:
                    raise ValueError(f"two address pools are named {a.name!r}")
                if a.cidr.version == b.cidr.version and a.cidr.overlaps(b.cidr):
                    raise ValueError(f"address pools {a.name!r} ({a.cidr}) and {b.name!r} ({b.cidr}) overlap")
        return pools


QUOTA_ENV_PREFIX = "Z9_QUOTA_"  # Z9_QUOTA_<UNIT>: Settings.quota_defaults[<unit>]


class QuotaDefaultsSource(PydanticBaseSettingsSource):
    """``quota_defaults`` from every ``Z9_QUOTA_<UNIT>`` variable (``Z9_QUOTA_<UNIT>=100`` →
    ``{"<unit>": "100"}``, validated by the model): one variable per unit, as before the units
    came from the type registry, whatever units it holds."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found = {k[len(QUOTA_ENV_PREFIX):].lower(): v for k, v in os.environ.items()
                 if k.upper().startswith(QUOTA_ENV_PREFIX) and k.upper() != QUOTA_ENV_PREFIX + "DEFAULTS"}
        return {"quota_defaults": found} if found else {}


class Settings(BaseSettings):
    """Every z9 setting. Units are in the names (``_s`` seconds, ``_mib`` MiB)."""

    # frozen: built once per process (a test: once per test, other values by model_copy) and
    # shared by everything in it, so nothing may change it under the services reading it
    model_config = SettingsConfigDict(env_prefix="Z9_", extra="ignore", frozen=True)

    # Pooled queries of every service (may go through PgBouncer). Several hosts for HA:
    # postgresql://z9@db1:5432,db2:5432/z9?target_session_attrs=read-write
    database_url: str | None = None
    # LISTEN connections and `z9 migrate`: direct to PostgreSQL (or a session pooler), never a
    # transaction pooler. Unset: Z9_DATABASE_URL (required with Z9_DATABASE_POOLER=transaction).
    database_direct_url: str | None = None
    # What sits in front of Z9_DATABASE_URL: none (direct), or PgBouncer in session or
    # transaction pool mode (then plan_cache_mode must come from ALTER ROLE/DATABASE … SET, and
    # transaction mode turns asyncpg's prepared-statement cache off).
    database_pooler: Literal["none", "session", "transaction"] = "none"
    # Refuse to LISTEN (so executors and the scheduler do not run) on a primary whose commits
    # do not wait for a synchronous standby: the 202 promise survives a failover only then.
    database_require_sync_replication: bool = False
    # A commit (or a statement outside a transaction) of a service's pooled connection without an
    # answer after this long is abandoned and its connection closed (z9.common.dbfence): a commit
    # waiting on synchronous replication for a standby that is gone. 0: no bound.
    database_sync_commit_timeout_s: float = Field(20.0, ge=0)
    # Bounded waits of every pooled connection (seconds; 0 = no bound), per role: a transaction
    # frozen while holding a row lock (a SIGSTOPped or partitioned process) stalls whoever waits on
    # it only this long. lock_timeout per role (the executor's is short: a finish that hits it is
    # retried on its own while the job keeps its lease); statement_timeout and
    # idle_in_transaction_session_timeout for all; TCP keepalives (server side, and the client's
    # socket) so a partitioned peer's session — and its locks — end within a minute, not two hours.
    api_db_lock_timeout_s: float = Field(5.0, ge=0)
    executor_db_lock_timeout_s: float = Field(2.0, ge=0)
    scheduler_db_lock_timeout_s: float = Field(5.0, ge=0)
    db_statement_timeout_s: float = Field(60.0, ge=0)
    db_idle_in_transaction_timeout_s: float = Field(15.0, ge=0)
    db_tcp_keepalives_idle_s: int = Field(30, ge=0)
    db_tcp_keepalives_interval_s: int = Field(10, ge=0)
    db_tcp_keepalives_count: int = Field(3, ge=0)
    data_dir: Path = Path(".z9")
    regions: dict[str, RegionSettings] = Field(default_factory=dict)

    # api
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # An API token's tenant is remembered this long per API process (seconds); a revoked token
    # keeps working for at most this long. 0: look every request's token up in the database.
    api_token_cache_s: float = Field(5.0, ge=0)
    # A token's last use (GET /v1/tokens) is written at most once per this many seconds per API
    # process, for all tokens used meanwhile in one statement: never a write per request.
    api_token_last_used_s: float = Field(60.0, gt=0)
    # The web console's sessions (server-side, z9.api.console): one ends after this many seconds
    # without use, and this many seconds after sign-in whatever its use (and with its token).
    console_session_idle_s: float = Field(43200.0, ge=60)
    console_session_max_s: float = Field(604800.0, ge=60)
    # The tracing UI a job's trace id links to in the console's operator view: a URL with
    # `{trace_id}` in it (Jaeger: http://127.0.0.1:16686/trace/{trace_id}). Unset: no link.
    tracing_ui_url: str | None = Field(None, pattern=r"^https?://.*\{trace_id\}")
    # Rate limit per tenant (all its tokens share one bucket) and API process: a bucket of this
    # many requests, refilled at this rate (requests per second); 0 turns it off. Over it: 429
    # with Retry-After.
    api_rate_limit_per_s: float = Field(20.0, ge=0)
    api_rate_limit_burst: int = Field(200, ge=0)
    # Plans (POST /v1/<kind>/{id}/actions/plan) running at once per API process, each waiting on
    # its region's Proxmox VE (4 threads per region): over it, 429 `too_many_plans` with Retry-After
    # at once. One tenant holds at most half of them (rounded up), so another tenant can still plan.
    api_max_concurrent_plans: int = Field(4, ge=1)
    # Failed authentications (unknown, expired or revoked bearer tokens) per client address and
    # API process: a bucket of this many, refilled at this rate (per second); 0 turns it off. Once
    # empty, a request with any bearer token from that address answers 429 with Retry-After
    # before its token is looked up (no database lookup per bad token).
    api_auth_failures_per_s: float = Field(1.0, ge=0)
    api_auth_failure_burst: int = Field(30, ge=0)
    # Kubeconfigs (GET /v1/clusters/{id}/kubeconfig): the longest expiry_s a client certificate
    # may be minted for (seconds; never past the minting token's own expiry either).
    kubeconfig_max_expiry_s: int = Field(86400, ge=60, le=365 * 86400)
    # Most pooled connections one API process opens (requests wait for one beyond it).
    api_pool_size: int = Field(16, ge=2, le=1024)
    # Connections one API process keeps open: in all (lowered to its descriptor limit — raised to
    # the hard limit at start — less a reserve) and per client address; one over either cap is
    # answered 503 and closed before it is read. Slow clients are cut: a request's headers must be
    # complete this many seconds after its first byte, its body after its headers; a connection
    # that sends nothing (new, or idle between requests) is closed after the idle timeout.
    api_max_connections: int = Field(10000, ge=1)
    api_max_connections_per_address: int = Field(1024, ge=1)
    api_header_timeout_s: float = Field(10.0, gt=0)
    api_body_timeout_s: float = Field(60.0, gt=0)
    api_idle_timeout_s: float = Field(30.0, gt=0)

    # executor
    executor_concurrency: int = Field(8, ge=1, le=1024)
    lease_ttl_s: float = Field(30.0, gt=0)
    heartbeat_s: float = Field(10.0, gt=0)
    # A job sends no Proxmox call later than this part of the TTL before its lease would expire,
    # counted from the last renewal this executor sent (monotonic clock): covers a request's time in
    # flight and queued at the node, and the clock skew between executor and database for the claim's
    # own expiry (z9.executor.lease_deadline). 0.2 of the default 30 s TTL: 6 s.
    lease_safety_margin: float = Field(0.2, ge=0, lt=1)
    poll_interval_s: float = Field(5.0, gt=0)
    # No progress (no answer about the job's task) for this long: stop renewing its lease.
    step_timeout_s: float = Field(120.0, gt=0)
    task_poll_s: float = Field(1.0, gt=0)
    task_deadline_s: float = Field(600.0, gt=0)
    shutdown_grace_s: float = Field(20.0, ge=0)
    snooze_s: float = Field(5.0, gt=0)
    tenant_max_running_jobs: int | None = Field(None, ge=0, description=(
        "Most jobs of one tenant running at once in a region, across every executor (unset: no cap). "
        "A tenant's own cap overrides it: `z9 quota --tenant T --running-jobs N` (a `running_jobs` row "
        "of tenant_quota_limits; `default` removes it). Whatever the caps, claims take tenants in turn "
        "(round-robin) and each tenant's jobs oldest first (docs/architecture.md, how a job is chosen). "
        "z9's own jobs (no tenant) are never capped."))
    tenant_metrics_top_n: int = Field(10, ge=0, le=1000, description=(
        "z9_tenant_jobs_pending and z9_tenant_oldest_pending_age_seconds name at most this many tenants "
        "per region (those with the most pending jobs); the rest are summed as tenant=\"_other\", so the "
        "metrics' cardinality is bounded whatever the number of tenants."))
    snooze_limit_s: float = Field(1800.0, ge=0)
    sdn_apply_batch_s: float = Field(1.0, ge=0, le=60, description=(
        "A region's SDN apply job waits this long after it was enqueued before it looks at what is "
        "pending: every network edit within the window goes out in the same `PUT /cluster/sdn` (PVE's "
        "apply is cluster-wide and reloads every node)."))
    sdn_reload_wait_s: float = Field(30.0, gt=0, le=600, description=(
        "After an SDN apply, how long z9 waits for every node to report z9's zone `available` (`GET "
        "/nodes/{node}/sdn/zones`: PVE's apply task ends OK whatever the nodes' reloads did) before the "
        "job retries naming the nodes that did not."))
    # With OTLP export on: the share of job attempts that ended succeeded with nothing to do (an
    # empty plan) whose spans are exported anyway; eventful attempts are always exported whole.
    trace_uneventful_ratio: float = Field(0.01, ge=0.0, le=1.0)
    # A mutation whose answer was lost may still be performed this long afterwards (seconds).
    uncertain_window_s: float = Field(120.0, ge=0)

    # backoff and attempts
    backoff_base_s: float = Field(2.0, gt=0)
    backoff_cap_s: float = Field(300.0, gt=0)
    backoff_jitter: float = Field(0.25, ge=0, lt=1)
    max_attempts: int = Field(10, ge=1)
    #: a DELETE or cancel-deletion answers 409 while the server already has this many live jobs:
    #: alternating them while its first job waits in retry would otherwise queue jobs without end
    #: (and every claim in the region steps over the queued ones)
    max_live_jobs_per_resource: int = Field(8, ge=2)

    # quotas per tenant: the default limit of each unit, from Z9_QUOTA_<UNIT> (absent: no limit;
    # `z9 quota` sets a tenant's own). The units are the resource types' (z9.resources.quota_units):
    # the services check the names when they start (a typo stops them), this model cannot.
    quota_defaults: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, json_schema_extra={"env_per_key": QUOTA_ENV_PREFIX})
    # Kubernetes clusters (issue 11). The installation key encrypts every cluster's private keys
    # (AES-256-GCM, the cluster id as associated data): 32 bytes, base64 (urlsafe or standard).
    # `z9 dev` generates one into its data dir. Unset: creating a cluster or minting a kubeconfig
    # answers 503 (the API says which setting is missing).
    installation_key: SecretStr | None = None
    # the installation key read from this file (a mounted secret) when Z9_INSTALLATION_KEY is unset
    installation_key_file: Path | None = None
    # a join token lives this long (kubeadm's --ttl); a member that has not joined by then gets a new one
    cluster_join_token_ttl_s: float = Field(900.0, gt=0)
    # storage the NoCloud bootstrap ISOs are uploaded to (shared: every node sees it; a node-local
    # storage gets the ISO on the member's own node)
    cluster_bootstrap_storage: str = "isos"
    # how long a member may take from start to a Ready node before the job says which one is late
    cluster_member_ready_s: float = Field(900.0, gt=0)
    # a running or degraded cluster is observed at least this often (seconds): the reaper enqueues
    # a ClusterObserve (members' power and Node readiness, running <-> degraded) when none is live
    cluster_observe_interval_s: float = Field(60.0, gt=0)
    # how long a server's create waits inside its guest (agent) for cloud-init to end, from z9's drive
    server_guest_ready_s: float = Field(900.0, ge=0, description=(
        "How long a server's create waits, through the guest agent, for cloud-init to end in the guest "
        "(then the instance-id and hostname must be the ones z9's cloud-init drive gave it; an error is "
        "the server's status_reason). 0: the guest is not looked into."))
    server_guest_slot_s: float = Field(20.0, gt=0, description=(
        "How long one claim of that job waits for the guest before it snoozes (its attempt given back, "
        "its executor slot free for other jobs) and looks again: guests that never boot do not hold "
        "the region's executor slots."))
    server_guest_poll_s: float = Field(1.0, gt=0, description=(
        "How often that wait asks the guest agent again while the guest is not up (each ask is a request "
        "through pveproxy)."))

    # scheduler, reaper, retention
    scheduler_interval_s: float = Field(1.0, gt=0)
    reaper_interval_s: float = Field(2.0, gt=0)
    drift_interval_s: float = Field(600.0, ge=0, description=(
        "How often the reaper plans each live resource read-only (its converging job's observe and plan, "
        "no Proxmox write) and records whether it drifted (z9_resources_drifted, the operator's drift "
        "view). 0: never."))
    drift_batch: int = Field(10, ge=1, description=(
        "At most this many resources of each type and region are planned per reaper pass (the stalest "
        "first): the drift check's load on a region's Proxmox is bounded."))
    deletion_buffer_s: float = Field(600.0, ge=0)
    job_retention_s: float = Field(7 * 86400.0, gt=0)
    idempotency_retention_s: float = Field(86400.0, gt=0)
    # Load balancer health is refreshed at least this often (seconds): the reaper enqueues a
    # LoadBalancerObserve for every live load balancer whose health is older (no other job live).
    lb_health_interval_s: float = Field(15.0, gt=0)
    # A load balancer's size (the shared hypervisor pays for it): at most this many targets ×
    # services (one HAProxy server line and one health check each), and at most this many health
    # checks per second per appliance (the sum over targets × services of 1 / interval_s).
    lb_max_target_services: int = Field(2000, ge=1)
    lb_max_checks_per_s: float = Field(200.0, gt=0)

    # observability
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # json: one JSON object per line (services); text: human-readable (`z9 dev` sets it).
    log_format: Literal["json", "text"] = "json"
    # Prometheus /metrics of every service, on a listener of its own (the API's never on the
    # tenants' port); port 0 = not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(0, ge=0, le=65535)
    # How often the scheduler recounts the job table for z9_jobs and the oldest pending age
    # (live statuses), and the finished jobs (most of the table) for z9_jobs.
    job_metrics_interval_s: float = Field(5.0, gt=0)
    job_metrics_finished_interval_s: float = Field(60.0, gt=0)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The usual sources, with ``Z9_QUOTA_<UNIT>`` read into ``quota_defaults`` after the
        constructor's own values."""
        return (init_settings, QuotaDefaultsSource(settings_cls), env_settings, dotenv_settings, file_secret_settings)

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _usable_dsn(cls, v: str | None) -> str | None:
        problem = dsn_problem(v) if v else None
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="before")
    @classmethod
    def _installation_key_from_file(cls, data: object) -> object:
        """``installation_key`` read from ``installation_key_file`` when only the file is named
        and this process has it (before validation: the model is frozen)."""
        if isinstance(data, dict) and data.get("installation_key") is None and data.get("installation_key_file"):
            key = read_secret_file(Path(data["installation_key_file"]))
            if key is not None:
                data = {**data, "installation_key": key}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        if self.database_pooler == "transaction" and self.database_direct_url in (None, "", self.database_url):
            raise ValueError("Z9_DATABASE_POOLER=transaction needs Z9_DATABASE_DIRECT_URL: a connection string "
                             "straight to PostgreSQL (or a session pooler) for the LISTEN connections and "
                             "z9 migrate; a transaction pooler drops notifications without an error")
        if self.heartbeat_s >= self.lease_ttl_s:
            raise ValueError(f"Z9_HEARTBEAT_S ({self.heartbeat_s}) must be shorter than Z9_LEASE_TTL_S "
                             f"({self.lease_ttl_s}), or every lease expires between heartbeats")
        if self.heartbeat_s + self.lease_safety_margin_s >= self.lease_ttl_s:
            raise ValueError(f"Z9_HEARTBEAT_S ({self.heartbeat_s}) plus Z9_LEASE_SAFETY_MARGIN "
                             f"({self.lease_safety_margin}) of Z9_LEASE_TTL_S must be shorter than Z9_LEASE_TTL_S "
                             f"({self.lease_ttl_s}), or a job stops calling Proxmox between heartbeats")
        if (self.database_sync_commit_timeout_s and self.db_statement_timeout_s
                and self.database_sync_commit_timeout_s >= self.db_statement_timeout_s):
            raise ValueError(f"Z9_DATABASE_SYNC_COMMIT_TIMEOUT_S ({self.database_sync_commit_timeout_s}) must be "
                             f"shorter than Z9_DB_STATEMENT_TIMEOUT_S ({self.db_statement_timeout_s}): PostgreSQL's "
                             "statement_timeout ends a commit's wait on synchronous replication with a success")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("Z9_BACKOFF_CAP_S must be at least Z9_BACKOFF_BASE_S")
        return self

    @property
    def lease_safety_margin_s(self) -> float:
        """The lease's safety margin in seconds (``lease_safety_margin`` of ``lease_ttl_s``)."""
        return self.lease_safety_margin * self.lease_ttl_s

    def db_lock_timeout_s(self, role: str) -> float:
        """``lock_timeout`` (seconds) of a service's pooled connections: ``api``, ``executor``,
        or ``scheduler`` (the scheduler and the reaper)."""
        return {"api": self.api_db_lock_timeout_s, "executor": self.executor_db_lock_timeout_s}.get(
            role, self.scheduler_db_lock_timeout_s)

    def require_database_url(self) -> str:
        """The database URL; raises ``SystemExit`` with a hint when ``Z9_DATABASE_URL`` is unset."""
        if not self.database_url:
            raise SystemExit(
                "Z9_DATABASE_URL is not set. Point it at PostgreSQL, or run `z9 dev`, "
                "which starts an embedded PostgreSQL for you."
            )
        return self.database_url
