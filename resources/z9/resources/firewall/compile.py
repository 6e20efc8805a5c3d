"""The compiler (pure): a server's firewalls → the rules and policies z9 writes on that server's VM firewall.

Semantics are Hetzner Cloud's (docs.hetzner.com/cloud/firewalls/faq): stateful (pve-firewall accepts
ESTABLISHED/RELATED before any rule: Firewall.pm ``ruleset_create_vm_chain``), inbound denied once any
firewall applies (``policy_in`` DROP: only the rules' sources get in), outbound allowed until the first
``out`` rule of any of the server's firewalls (then ``policy_out`` DROP). Every tenant rule is an ACCEPT.

One tenant rule becomes one PVE rule per address family and per chunk of its addresses: pve-firewall
refuses a rule mixing IPv4 and IPv6 (Firewall.pm ``parse_address_list``: "you can't mix ipv4 and ipv6
addresses") and an address list longer than 512 characters (``$max_ipset_name_length``'s sibling check in
``parse_address_list``: "value too long"); ``0.0.0.0/0`` with ``::/0`` is "from anywhere" (no ``source``).
A rule naming "members of firewall X" (``source_firewalls``/``destination_firewalls``) becomes one rule per
firewall on the cluster IP set ``+dc/<ipset_name(X)>`` that X's jobs keep equal to X's members' addresses.
Ports: ``80`` → ``dport 80``, ``80-85`` → ``80:85`` (PVE's range syntax, Firewall.pm ``parse_port_name_number_or_range``),
``any`` → no ``dport``; icmp/esp/gre take none (PVE: "protocol 'esp' does not support ports").

The comment of every rule is ``z9 firewall <firewall id>: rule <n>[: <description>]`` (:data:`RULE_PREFIX`),
the prefix the firewall type declares (``VmParts.firewall_rules``): the VM machinery rewrites those rules
whole, under the list's digest, after the owner kind's platform rules, which no tenant rule removes.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the comment prefix of every VM firewall rule the firewall type writes (its declared part)
RULE_PREFIX = "z9 firewall "
#: pve-firewall's longest address list in one rule (Firewall.pm parse_address_list: "value too long")
MAX_ADDRESS_TEXT = 512
MAX_RULES = 50  # per firewall (Hetzner: "Rules are limited to 50 entries per Firewall")
MAX_EFFECTIVE = 500  # PVE rules one firewall compiles to (Hetzner: "and 500 effective rules")
MAX_CIDRS = 100  # per rule (Hetzner: "You can specify 100 CIDR blocks at most")
MAX_PER_SERVER = 5  # firewalls applied to one server (Hetzner's limit)
PROTOCOLS = ("tcp", "udp", "icmp", "esp", "gre")
WITH_PORTS = ("tcp", "udp")
ANY = {4: "0.0.0.0/0", 6: "::/0"}


def ipset_name(firewall_id: str) -> str:
    """The cluster IP set holding firewall ``firewall_id``'s members' addresses (``+dc/<name>`` in a rule);
    IP set names: ``[A-Za-z][A-Za-z0-9\\-\\_]+``, at most 64 characters (Firewall.pm ``$max_ipset_name_length``)."""
    return f"z9-{firewall_id}"


def rule_prefix(firewall_id: str) -> str:
    return f"{RULE_PREFIX}{firewall_id}: "


def canonical_cidr(text: str) -> str:
    """A CIDR as z9 stores and writes it: the network (host bits cleared), IPv6 in RFC 5952 form, a host
    without its /32 or /128 (as pve-firewall's ``parse_ip_or_cidr`` stores it). Raises ValueError."""
    net = ipaddress.ip_network(text.strip(), strict=False)
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return str(net)


def port_param(port: str | None) -> str | None:
    """Hetzner's port (``80``, ``80-85``, ``any``) as PVE's ``dport`` (None: every port)."""
    if port is None or port == "any":
        return None
    return port.replace("-", ":")


def _families(cidrs: Iterable[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for c in cidrs:
        out.setdefault(ipaddress.ip_network(c, strict=False).version, []).append(c)
    return out


def _chunks(cidrs: list[str]) -> list[str]:
    """Comma lists of at most :data:`MAX_ADDRESS_TEXT` characters."""
    out: list[str] = []
    cur = ""
    for c in cidrs:
        nxt = f"{cur},{c}" if cur else c
        if len(nxt) > MAX_ADDRESS_TEXT and cur:
            out.append(cur)
            cur = c
        else:
            cur = nxt
    if cur:
        out.append(cur)
    return out


def _address_sets(cidrs: list[str]) -> list[str | None]:
    """The address lists one rule compiles to: None for "anywhere" (both families' /0)."""
    fam = _families(cidrs)
    if ANY[4] in fam.get(4, []) and ANY[6] in fam.get(6, []):
        return [None]
    out: list[str | None] = []
    for v in (4, 6):
        got = fam.get(v, [])
        if ANY[v] in got:
            out.append(ANY[v])
        elif got:
            out.extend(_chunks(got))
    return out


def compile_rule(firewall_id: str, n: int, rule: Mapping[str, Any]) -> list[dict[str, str]]:
    """One tenant rule (``rules[n]``, as stored) → the PVE rules (``POST …/firewall/rules`` params)."""
    inbound = rule["direction"] == "in"
    addr_key = "source" if inbound else "dest"
    cidrs = list(rule.get("source_ips" if inbound else "destination_ips") or [])
    members = list(rule.get("source_firewalls" if inbound else "destination_firewalls") or [])
    comment = f"{rule_prefix(firewall_id)}rule {n}" + (f": {rule['description']}" if rule.get("description") else "")
    base: dict[str, str] = {"type": rule["direction"], "action": "ACCEPT", "proto": rule["protocol"]}
    dport = port_param(rule.get("port")) if rule["protocol"] in WITH_PORTS else None
    if dport:
        base["dport"] = dport
    out = []
    for addrs in (_address_sets(cidrs) if cidrs else []):
        r = dict(base)
        if addrs is not None:
            r[addr_key] = addrs
        out.append({**r, "comment": comment})
    for fw in members:
        out.append({**base, addr_key: f"+dc/{ipset_name(fw)}", "comment": comment})
    return out


@dataclass(frozen=True)
class Compiled:
    """What a server's firewalls write on its VM: the rules in order, and the policies they close."""

    rules: tuple[dict[str, str], ...]
    policy_in: str | None
    policy_out: str | None


def compile_firewall(firewall_id: str, rules: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [r for n, rule in enumerate(rules) for r in compile_rule(firewall_id, n, rule)]


def compile_server(firewalls: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> Compiled | None:
    """A server's firewalls (id, rules), in id order → its VM's part; None when none applies (the server
    kind's own policies stand)."""
    if not firewalls:
        return None
    rules = tuple(r for fid, rs in sorted(firewalls, key=lambda f: f[0]) for r in compile_firewall(fid, rs))
    any_out = any(rule["direction"] == "out" for _, rs in firewalls for rule in rs)
    return Compiled(rules, "DROP", "DROP" if any_out else None)


def effective_count(firewall_id: str, rules: Sequence[Mapping[str, Any]]) -> int:
    """How many PVE rules ``rules`` compile to (the 500 effective rules limit)."""
    return len(compile_firewall(firewall_id, rules))
