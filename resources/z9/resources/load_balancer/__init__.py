"""The ``load_balancer`` type: one or two HAProxy appliance VMs (members ``lb-0``, ``lb-1``) in
front of servers or IPs; two-phase deletion (LoadBalancerStop during the buffer: appliances
stopped, addresses kept; LoadBalancerDelete at its end). Its health is refreshed periodically by
an observe-only LoadBalancerObserve job (``extra["periodic"]``: the reaper enqueues it)."""
from __future__ import annotations

import ipaddress
from typing import Any

from z9.resources.load_balancer.model import LoadBalancer
from z9.resources import (Buffered, FirewallContribution, Periodic, PlanOf, QuotaUnit, QuotaUsage, ResourceType,
                          VmParts, on_final_delete, register)
from z9.resources.load_balancer import store as load_balancer_store

# the job kinds of this type (the ``kind`` column's values)
LOAD_BALANCER_CREATE = "LoadBalancerCreate"
LOAD_BALANCER_CONFIGURE = "LoadBalancerConfigure"
LOAD_BALANCER_STOP = "LoadBalancerStop"
LOAD_BALANCER_START = "LoadBalancerStart"
LOAD_BALANCER_DELETE = "LoadBalancerDelete"
LOAD_BALANCER_OBSERVE = "LoadBalancerObserve"

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


#: the comment prefix of the rules a load balancer writes on its target servers' VMs
TARGET_RULE = "z9 load balancer "


async def target_contribution(db: Any, owner: str, member: str) -> FirewallContribution | None:
    """What the load balancers targeting server ``owner`` need on its VM: their appliances' addresses in,
    on each service's destination and health-check ports — the platform's part of a target: a tenant's
    firewall on the server (inbound closed) never cuts its load balancer off (``when_closed``: a server
    open to everything needs no rule). None when no live load balancer targets it."""
    if member != "main":
        return None
    rules: list[dict[str, str]] = []
    for lb in await load_balancer_store.lb_targeting_server(db, owner):
        if lb.status in ("deleted", "destroying"):
            continue
        ips = sorted({str(a["ip"]) for a in (lb.addresses or {}).values() if isinstance(a, dict) and a.get("ip")})
        ports = sorted({int(s["destination_port"]) for s in lb.services}
                       | {int((s.get("health_check") or {}).get("port") or s["destination_port"]) for s in lb.services})
        for version in (4, 6):
            src = [ip for ip in ips if ipaddress.ip_address(ip).version == version]
            if src and ports:
                rules.append({"type": "in", "action": "ACCEPT", "proto": "tcp", "source": ",".join(src),
                              "dport": ",".join(str(p) for p in ports),
                              "comment": f"{TARGET_RULE}{lb.id}: its appliances to its target ports and health checks"})
    return FirewallContribution(rules=tuple(rules), when_closed=True) if rules else None


def restore(lb: LoadBalancer) -> tuple[str, dict[str, Any]]:
    """A cancelled deletion: a load balancer still being created is created (the create job
    converges), any other gets its appliances started again and its configuration checked."""
    if lb.status_before_delete == "creating":
        return LOAD_BALANCER_CREATE, {}
    return LOAD_BALANCER_START, {}


async def plan_of(db: Any, lb: LoadBalancer) -> PlanOf:
    """A plan of a load balancer previews its configure job: its appliances converged (the VM
    machinery's steps per member) and running the files rendered from the database now."""
    return PlanOf(LOAD_BALANCER_CONFIGURE, {})


LOAD_BALANCER: ResourceType[LoadBalancer] = register(ResourceType(
    name="load_balancer", prefix="lb", table="load_balancers", model=LoadBalancer, plural="load-balancers",
    kinds=(LOAD_BALANCER_CREATE, LOAD_BALANCER_CONFIGURE, LOAD_BALANCER_STOP,
           LOAD_BALANCER_START, LOAD_BALANCER_DELETE, LOAD_BALANCER_OBSERVE),
    deletion=Buffered(first_kind=LOAD_BALANCER_STOP, final_kind=LOAD_BALANCER_DELETE),
    statuses=STATUSES, restore=restore, plan_of=plan_of,
    periodic=Periodic(kind=LOAD_BALANCER_OBSERVE, interval_setting="lb_health_interval_s",
                      statuses=("active", "failed")),
    order=30,
    # on its target servers' VMs: its appliances reach the targets' ports and health checks through a
    # tenant's firewall (rules written only while the server's inbound is closed: target_contribution)
    vm_parts=VmParts(firewall_rules=(TARGET_RULE,), firewall=target_contribution),
    quotas=(QuotaUnit("load_balancers", "load balancers", example=(2, 0)),),
    quota_usage=QuotaUsage("load_balancer_quota_usage", {
        "load_balancers": "load balancers (each also uses 2 or 3 addresses)"}),
))


async def _server_deleted(conn: Any, server_id: str, max_attempts: int) -> list[Any]:
    """A server's final delete finishes: every live load balancer targeting it is reconfigured in
    that transaction (its rendering leaves the server out: it reports ``unused``/``server_deleted``
    until the owner removes the target), so no appliance keeps sending traffic to an address a
    new VM may get. A load balancer being deleted is left alone (its appliances are stopped)."""

    return [LOAD_BALANCER.new_job(lb, LOAD_BALANCER_CONFIGURE, args={"reason": f"server {server_id} deleted"},
                                  max_attempts=max_attempts)
            for lb in await load_balancer_store.lb_targeting_server(conn, server_id)
            if lb.status not in ("deleting", "destroying", "deleted")]


on_final_delete("server", _server_deleted)


# ---------------------------------------------------------------- what an ip target may reach
#
# A load balancer's appliances sit on the region's bridge: an ``ip`` target is a connection from
# inside the platform's network, and its per-target health a port scanner. So an ip target is
# allowed only where the operator allows it (the rules in order, the first that matches decides):
#
#   platform_network       in one of the ``platform_networks`` of any region: refused, always
#   another_tenant         a live address of this cloud (any region) held by another tenant: refused
#   load_balancer_address  a VIP or appliance address of any load balancer (the tenant's own
#                          included): refused — a load balancer never targets a load balancer, so
#                          no two can form a loop (simpler to state and to check than "no cycle")
#   (own address)          any other live address of the tenant (a floating or primary one): allowed
#   address_pool           inside an address pool's network of any region (a free IP, the gateway,
#                          a reserved one): refused — a free IP may be handed to another tenant
#                          tomorrow, and the next configure would then forward to it
#   (allowed private)      inside one of the region's ``lb_target_private_networks``: allowed
#   private_range          RFC 1918, shared (100.64/10), benchmarking (198.18/15), IETF protocol
#                          assignments (192.0.0/24), and every range the API already refuses
#                          (0/8, loopback, link-local, multicast, 240/4): refused
#   otherwise              a public unicast address: allowed. The documentation ranges (192.0.2/24,
#                          198.51.100/24, 203.0.113/24) count as public: ``z9 dev`` and the tests
#                          use them as a stand-in for the internet.
#
# The API checks it at every action and create (422 naming the rule); the executor checks it again
# at every configure (it renders a refused target out of the config and reports it in health as
# ``refused`` with the rule as reason), so an address that changed hands since is dropped.

NOT_PUBLIC = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "198.18.0.0/15", "192.0.0.0/24",
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"))

RULE_TEXT = {
    "platform_network": "is in a platform network of a region",
    "another_tenant": "is an address of this cloud that another tenant holds",
    "load_balancer_address": "is the VIP or an appliance address of a load balancer (a load balancer never targets "
                             "a load balancer)",
    "address_pool": "is in an address pool of a region and not one of your addresses",
    "private_range": "is in a private or otherwise non-public range that the region does not open to load "
                     "balancer targets (lb_target_private_networks)",
}


def ip_target_refusal(ip: str, tenant_id: str, holder: dict[str, Any] | list[dict[str, Any]] | None, *,
                      platform_networks: list[Any], pool_networks: list[Any],
                      private_allowed: list[Any]) -> str | None:
    """Pure: the rule refusing ``ip`` as an ip target of a load balancer of ``tenant_id`` (see
    above), or None when it is allowed. ``holder``: the live address holding the IP
    (``{"tenant_id", "kind"}``), or every one, of any region, that does (a list: regions may reuse
    a range); None or empty when none does. The networks are those of every configured region
    (:func:`target_networks`): an appliance's bridge may route to another region's."""
    addr = ipaddress.ip_address(ip)
    holders = [holder] if isinstance(holder, dict) else list(holder or [])

    def within(nets: list[Any]) -> bool:
        return any(addr.version == n.version and addr in n for n in nets)

    if within(platform_networks):
        return "platform_network"
    if holders:
        if any(h["tenant_id"] != tenant_id for h in holders):
            return "another_tenant"
        if any(h["kind"] == "load_balancer" for h in holders):
            return "load_balancer_address"
        return None
    if within(pool_networks):
        return "address_pool"
    if within(private_allowed):
        return None
    if within(list(NOT_PUBLIC)) or (addr.version == 6 and not addr.is_global):
        return "private_range"
    return None


def target_networks(regions: dict[str, Any], region: str) -> dict[str, list[Any]]:
    """The keyword arguments of :func:`ip_target_refusal` for a load balancer of ``region``: the
    platform networks and address pools of every configured region (``regions``: ``{name:
    RegionSettings}``) — a load balancer of one region targeting another region's VIP, free pool
    IP or platform VM is as much a way in as in its own — and the private networks its own
    region opens (``lb_target_private_networks`` is a per-region choice)."""
    own = region_networks(regions.get(region))
    return {"platform_networks": [n for r in regions.values() for n in r.platform_networks],
            # a region's private network is a pool too (z9 hands its addresses to guests)
            "pool_networks": [p.cidr for r in regions.values() for p in r.address_pools]
            + [r.private_network.cidr for r in regions.values() if getattr(r, "private_network", None)],
            "private_allowed": own["private_allowed"]}


def region_networks(region: Any) -> dict[str, list[Any]]:
    """The keyword arguments of :func:`ip_target_refusal` from a region's settings (None: an
    unknown region, where only the fixed rules apply)."""
    if region is None:
        return {"platform_networks": [], "pool_networks": [], "private_allowed": []}
    return {"platform_networks": list(region.platform_networks),
            "pool_networks": [p.cidr for p in region.address_pools]
            + ([region.private_network.cidr] if getattr(region, "private_network", None) else []),
            "private_allowed": list(region.lb_target_private_networks)}
