"""The ``load_balancer`` type: one or two HAProxy appliance VMs (members ``lb-0``, ``lb-1``) in
front of servers or IPs; two-phase deletion (LoadBalancerStop during the buffer: appliances
stopped, addresses kept; LoadBalancerDelete at its end). Its health is refreshed periodically by
an observe-only LoadBalancerObserve job (``extra["periodic"]``: the reaper enqueues it)."""
from __future__ import annotations

from typing import Any

from .. import kinds
from ..models import LoadBalancer
from . import Buffered, Periodic, ResourceType, on_final_delete, register

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


def restore(lb: LoadBalancer) -> tuple[str, dict[str, Any]]:
    """A cancelled deletion: a load balancer still being created is created (the create job
    converges), any other gets its appliances started again and its configuration checked."""
    if lb.status_before_delete == "creating":
        return kinds.LOAD_BALANCER_CREATE, {}
    return kinds.LOAD_BALANCER_START, {}


LOAD_BALANCER: ResourceType[LoadBalancer] = register(ResourceType(
    name="load_balancer", prefix="lb", table="load_balancers", model=LoadBalancer, plural="load-balancers",
    kinds=(kinds.LOAD_BALANCER_CREATE, kinds.LOAD_BALANCER_CONFIGURE, kinds.LOAD_BALANCER_STOP,
           kinds.LOAD_BALANCER_START, kinds.LOAD_BALANCER_DELETE, kinds.LOAD_BALANCER_OBSERVE),
    deletion=Buffered(first_kind=kinds.LOAD_BALANCER_STOP, final_kind=kinds.LOAD_BALANCER_DELETE),
    statuses=STATUSES, restore=restore,
    periodic=Periodic(kind=kinds.LOAD_BALANCER_OBSERVE, interval_setting="lb_health_interval_s",
                      statuses=("active", "failed")),
))


async def _server_deleted(conn: Any, server_id: str, max_attempts: int) -> list[Any]:
    """A server's final delete finishes: every live load balancer targeting it is reconfigured in
    that transaction (its rendering leaves the server out: it reports ``unused``/``server_deleted``
    until the owner removes the target), so no appliance keeps sending traffic to an address a
    new VM may get. A load balancer being deleted is left alone (its appliances are stopped)."""
    from .. import store

    return [LOAD_BALANCER.new_job(lb, kinds.LOAD_BALANCER_CONFIGURE, args={"reason": f"server {server_id} deleted"},
                                  max_attempts=max_attempts)
            for lb in await store.lb_targeting_server(conn, server_id)
            if lb.status not in ("deleting", "destroying", "deleted")]


on_final_delete("server", _server_deleted)
