"""``z9 load-balancers create|list|get|update|delete|restore`` and the actions ``add-target``,
``remove-target``, ``add-service``, ``update-service``, ``delete-service``, ``change-algorithm``
(each a LoadBalancerConfigure job; the API's ``POST /load-balancers/{id}/actions/…``).

Services on the command line: ``--service PROTOCOL:LISTEN_PORT:DESTINATION_PORT`` (``tcp:80:8080``),
repeatable, each with the health check the ``--health-*`` flags describe (default: TCP on the
destination port); targets: ``--target srv_…`` (a server of the region) or ``--target 192.0.2.7``
(an IP), repeatable.
"""
from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from z9.client.api import lb_target
from z9.client.models import LOAD_BALANCERS, LoadBalancer
from z9.client.commands._kind import (LABEL_ARGS, Action, Arg, KindSpec, Update, given, label, labels_of, labels_text, status_text)

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")
TYPES = ("lb-small", "lb-ha")
ALGORITHMS = ("round_robin", "least_connections")
PROTOCOLS = ("tcp", "http")


def _service(text: str) -> tuple[str, int, int]:
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in PROTOCOLS or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"a service is PROTOCOL:LISTEN_PORT:DESTINATION_PORT (tcp:80:8080), "
                                         f"not {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def _target(text: str) -> dict[str, Any]:
    if text.startswith("srv_"):
        return lb_target(server_id=text)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a target is a server id (srv_…) or an IP address, not {text!r}")
    return lb_target(ip=text)


def _codes(text: str) -> list[str]:
    return [c for c in text.split(",") if c]


# the health check of a service, as flags (the API's HealthCheck; left out: the API's default)
HEALTH_ARGS = (
    Arg("--health-protocol", choices=PROTOCOLS, help="health check protocol (default tcp)"),
    Arg("--health-port", type=int, metavar="PORT", help="health check port (default: the destination port)"),
    Arg("--health-interval", type=int, metavar="SECONDS", help="seconds between checks (default 15)"),
    Arg("--health-timeout", type=int, metavar="SECONDS", help="a check's timeout (default 10)"),
    Arg("--health-retries", type=int, metavar="N", help="failed checks before unhealthy (default 3)"),
    Arg("--health-path", metavar="PATH", help="http checks: the request path (default /)"),
    Arg("--health-status-codes", type=_codes, metavar="CODES", help="http checks: e.g. 2??,3?? (the default)"),
)


def _health(a: argparse.Namespace, port: int | None) -> dict[str, Any] | None:
    hc = given(protocol=a.health_protocol, port=a.health_port if a.health_port is not None else port,
               interval_s=a.health_interval, timeout_s=a.health_timeout, retries=a.health_retries)
    http = given(path=a.health_path, status_codes=a.health_status_codes)
    if http:
        hc["http"] = http
    return hc or None


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    services = []
    for protocol, listen, dest in a.service or []:
        s: dict[str, Any] = {"protocol": protocol, "listen_port": listen, "destination_port": dest}
        hc = _health(a, None)
        if hc is not None:
            s["health_check"] = {"port": dest, **hc}
        services.append(s)
    return given(name=a.name, region=a.region, type=a.type, algorithm=a.algorithm, address_pool=a.address_pool,
                 labels=dict(a.label) if a.label else None, services=services, targets=a.target or [])


def _one_target(a: argparse.Namespace) -> dict[str, Any]:
    return lb_target(server_id=a.server, ip=a.ip)


def _target_check(a: argparse.Namespace) -> str | None:
    return None if (a.server is None) != (a.ip is None) else "give --server SERVER_ID or --ip IP (one of them)"


def _add_service(a: argparse.Namespace) -> dict[str, Any]:
    body = given(protocol=a.protocol, listen_port=a.listen_port, destination_port=a.destination_port,
                 proxyprotocol=True if a.proxyprotocol else None)
    hc = _health(a, a.health_port)
    if hc is not None:
        body["health_check"] = {"port": a.destination_port, **hc}
    return body


def _update_service(a: argparse.Namespace) -> dict[str, Any]:
    body = given(listen_port=a.listen_port, protocol=a.protocol, destination_port=a.destination_port,
                 proxyprotocol=a.proxyprotocol)
    hc = _health(a, a.health_port)
    if hc is not None:
        body["health_check"] = hc
    return body


TARGET_ARGS = (Arg("--server", metavar="SERVER_ID", help="a server of the load balancer's region (srv_…)"),
               Arg("--ip", help="an IP address outside the cloud"))
SERVICE_ARGS = (Arg("--listen-port", type=int, required=True, metavar="PORT"),)


def _services_text(lb: LoadBalancer) -> str:
    return ", ".join(f"{s['protocol']}:{s['listen_port']}:{s['destination_port']}" for s in lb.services)


def _targets_text(lb: LoadBalancer) -> str:
    out = []
    for t in lb.targets:
        states = {h.get("status") for h in t.get("health_status") or []}
        health = "/".join(sorted(s for s in states if s)) or "-"
        out.append(f"{t.get('server_id') or t.get('ip')} ({health})")
    return ", ".join(out)


def _members_text(lb: LoadBalancer) -> str:
    return ", ".join(f"{m.get('name')} {m.get('ip') or ''}{' (VIP)' if m.get('holds_vip') else ''}".strip()
                     for m in lb.members)


KIND = KindSpec(
    kind=LOAD_BALANCERS,
    help="load balancers: create, list, get, update, delete, restore, add-target, remove-target, add-service, "
         "update-service, delete-service, change-algorithm",
    statuses=STATUSES,
    id_help="the load balancer's id (lb_…)",
    columns=(("ID", lambda lb: lb.id), ("NAME", lambda lb: lb.name), ("STATUS", lambda lb: lb.status),
             ("HEALTH", lambda lb: lb.health), ("TYPE", lambda lb: lb.type), ("VIP", lambda lb: lb.vip),
             ("SERVICES", _services_text), ("TARGETS", lambda lb: len(lb.targets)),
             ("REGION", lambda lb: lb.region)),
    fields=(("id", lambda lb: lb.id), ("name", lambda lb: lb.name), ("status", status_text),
            ("health", lambda lb: lb.health), ("type", lambda lb: lb.type), ("algorithm", lambda lb: lb.algorithm),
            ("vip", lambda lb: lb.vip), ("region", lambda lb: lb.region), ("services", _services_text),
            ("targets", _targets_text), ("appliances", _members_text),
            ("labels", lambda lb: labels_text(lb.labels)), ("delete after", lambda lb: lb.delete_after),
            ("created", lambda lb: lb.created_at)),
    create_help="create a load balancer (a LoadBalancerCreate job: appliances cloned, configured, checked)",
    create_args=(
        Arg("--name", required=True, help="DNS label, unique in your tenant"),
        Arg("--region", required=True),
        Arg("--type", choices=TYPES, help="lb-small (one appliance, the default) or lb-ha (two, keepalived)"),
        Arg("--algorithm", choices=ALGORITHMS, help="round_robin (default) or least_connections"),
        Arg("--service", action="append", type=_service, metavar="PROTO:LISTEN:DEST",
            help="a service, e.g. tcp:80:8080 (repeatable; its health check from the --health-* flags)"),
        Arg("--target", action="append", type=_target, metavar="SERVER_ID|IP", help="a target (repeatable)"),
        Arg("--label", action="append", type=label, metavar="KEY=VALUE", help="repeatable"),
        Arg("--address-pool", metavar="POOL", help="the pool of the VIP and appliance addresses (default public)"),
        *HEALTH_ARGS),
    create_body=create_body,
    update=Update(args=(Arg("--name", help="the new name"), *LABEL_ARGS),
                  body=lambda a: given(name=a.name, labels=labels_of(a)),
                  help="rename a load balancer or replace its labels (no job)"),
    delete_help="delete a load balancer: appliances stopped at once, VIP kept until the buffer ends (restorable)",
    restore_help="cancel a load balancer's deletion within its buffer (its appliances started again)",
    actions=(
        Action("add-target", "add-target", "add a target: --server SERVER_ID or --ip IP", TARGET_ARGS, _one_target,
               check=_target_check),
        Action("remove-target", "remove-target", "remove a target: --server SERVER_ID or --ip IP", TARGET_ARGS,
               _one_target, check=_target_check),
        Action("add-service", "add-service", "add a service (a listen port, where it goes, its health check)",
               (Arg("--protocol", choices=PROTOCOLS, default="tcp"), *SERVICE_ARGS,
                Arg("--destination-port", type=int, required=True, metavar="PORT"),
                Arg("--proxyprotocol", action="store_true", help="send the PROXY protocol header"),
                *HEALTH_ARGS), _add_service),
        Action("update-service", "update-service",
               "change the service on --listen-port (only the given fields; the health check's too)",
               (*SERVICE_ARGS, Arg("--protocol", choices=PROTOCOLS),
                Arg("--destination-port", type=int, metavar="PORT"),
                Arg("--proxyprotocol", action=argparse.BooleanOptionalAction, default=None),
                *HEALTH_ARGS), _update_service),
        Action("delete-service", "delete-service", "delete the service on --listen-port", SERVICE_ARGS,
               lambda a: {"listen_port": a.listen_port}),
        Action("change-algorithm", "change-algorithm", "change the balancing algorithm",
               (Arg("--algorithm", "--type", dest="algorithm", choices=ALGORITHMS, required=True),),
               lambda a: {"type": a.algorithm}),
    ),
)

register = KIND.register
