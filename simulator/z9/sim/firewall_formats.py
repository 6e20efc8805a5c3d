"""The parameters of pve-firewall's rules: the names and numbers they may use and the registered
formats the API schema checks them with (``pve-fw-addr-spec``, ``pve-fw-dport-spec``,
``pve-fw-sport-spec``, ``pve-fw-protocol-spec``, ``pve-fw-icmp-type-spec``; pve-common's ``pve-iface``).

Source: pve-firewall ``src/PVE/Firewall.pm`` at 6f1311f3 (``parse_address_list``,
``parse_port_name_number_or_range``, ``pve_fw_verify_*``, ``get_etc_protocols``, ``get_etc_services``,
``$PROTOCOLS_WITH_PORTS``, ``$icmp_type_names``, ``$pve_fw_macros``, ``$rule_properties``). A leaf
module: the schema validator (:mod:`z9.sim.schema`) and the firewall (:mod:`z9.sim.firewall`) both use it.
"""

from __future__ import annotations

import re

# Debian netbase's /etc/protocols (what ``get_etc_protocols`` reads on a PVE 9 node), name → number,
# plus pve-firewall's own ``icmpv6`` (a name without a number)
PROTOCOLS: dict[str, int | None] = {
    "ip": 0, "hopopt": 0, "icmp": 1, "igmp": 2, "ggp": 3, "ipencap": 4, "st": 5, "tcp": 6, "egp": 8, "igp": 9,
    "pup": 12, "udp": 17, "hmp": 20, "xns-idp": 22, "rdp": 27, "iso-tp4": 29, "dccp": 33, "xtp": 36, "ddp": 37,
    "idpr-cmtp": 38, "ipv6": 41, "ipv6-route": 43, "ipv6-frag": 44, "idrp": 45, "rsvp": 46, "gre": 47,
    "esp": 50, "ah": 51, "skip": 57, "ipv6-icmp": 58, "ipv6-nonxt": 59, "ipv6-opts": 60, "rspf": 73,
    "vmtp": 81, "eigrp": 88, "ospf": 89, "ax.25": 93, "ipip": 94, "etherip": 97, "encap": 98, "pim": 103,
    "ipcomp": 108, "vrrp": 112, "l2tp": 115, "isis": 124, "sctp": 132, "fc": 133, "mobility-header": 135,
    "udplite": 136, "mpls-in-ip": 137, "manet": 138, "hip": 139, "shim6": 140, "wesp": 141, "rohc": 142,
    "ethernet": 143, "mptcp": 262, "icmpv6": None,
}
PROTOCOL_IDS = {str(n) for n in PROTOCOLS.values() if n is not None}
# Firewall.pm $PROTOCOLS_WITH_PORTS
PROTOCOLS_WITH_PORTS = {"udp", "17", "udplite", "136", "tcp", "6", "dccp", "33", "sctp", "132"}
# Firewall.pm $icmp_type_names / $icmpv6_type_names (iptables -p icmp -h / ip6tables -p icmpv6 -h)
ICMP_TYPES = {
    "any", "echo-reply", "destination-unreachable", "network-unreachable", "host-unreachable",
    "protocol-unreachable", "port-unreachable", "fragmentation-needed", "source-route-failed",
    "network-unknown", "host-unknown", "network-prohibited", "host-prohibited", "TOS-network-unreachable",
    "TOS-host-unreachable", "communication-prohibited", "host-precedence-violation", "precedence-cutoff",
    "source-quench", "redirect", "network-redirect", "host-redirect", "TOS-network-redirect",
    "TOS-host-redirect", "echo-request", "router-advertisement", "router-solicitation", "time-exceeded",
    "ttl-zero-during-transit", "ttl-zero-during-reassembly", "parameter-problem", "ip-header-bad",
    "required-option-missing", "timestamp-request", "timestamp-reply", "address-mask-request",
    "address-mask-reply",
}
ICMPV6_TYPES = {
    "destination-unreachable", "no-route", "communication-prohibited", "beyond-scope", "address-unreachable",
    "port-unreachable", "failed-policy", "reject-route", "packet-too-big", "time-exceeded",
    "ttl-zero-during-transit", "ttl-zero-during-reassembly", "parameter-problem", "bad-header",
    "unknown-header-type", "unknown-option", "echo-request", "echo-reply", "router-solicitation",
    "router-advertisement", "neighbor-solicitation", "neighbour-solicitation", "neighbor-advertisement",
    "neighbour-advertisement", "redirect",
}
# Firewall.pm $pve_fw_macros: the macros whose ports the simulator knows (a subset: other macro names
# are refused as unknown — PVE knows ~90, z9 uses none)
MACROS: dict[str, list[dict[str, str]]] = {
    "SSH": [{"proto": "tcp", "dport": "22"}],
    "HTTP": [{"proto": "tcp", "dport": "80"}],
    "HTTPS": [{"proto": "tcp", "dport": "443"}],
    "Web": [{"proto": "tcp", "dport": "80"}, {"proto": "tcp", "dport": "443"}],
    "DNS": [{"proto": "udp", "dport": "53"}, {"proto": "tcp", "dport": "53"}],
    "Ping": [{"proto": "icmp", "dport": "echo-request"}],
}
RULE_KEYS = ("type", "action", "macro", "iface", "source", "dest", "proto", "dport", "sport", "log", "icmp-type",
             "comment", "enable")
# Firewall.pm $rule_properties (what copy_rule_data copies; pos and digest too, never saved)
RULE_PROPERTIES = RULE_KEYS + ("pos", "digest")
SECURITY_GROUP_RE = re.compile(r"[A-Za-z][A-Za-z0-9\-_]+")
IPSET_REF_RE = re.compile(r"\+(guest/|dc/|sdn/)?([A-Za-z][A-Za-z0-9\-_]+)")
ALIAS_REF_RE = re.compile(r"(dc/|guest/)?([A-Za-z][A-Za-z0-9\-_]+)")


def _services() -> dict[str, int]:
    """``get_etc_services``: /etc/services names of tcp/udp/sctp ports (Debian netbase, as on a PVE node)."""
    global _SERVICES
    if _SERVICES is None:
        out: dict[str, int] = {}
        try:
            with open("/etc/services", encoding="utf-8", errors="replace") as f:
                for line in f:
                    m = re.match(r"^(\S+)\s+(\d+)/(tcp|udp|sctp)", line)
                    if m and not line.startswith("#"):
                        out[m.group(1)] = int(m.group(2))
        except OSError:
            out = {"ssh": 22, "http": 80, "https": 443}
        _SERVICES = out
    return _SERVICES


_SERVICES: dict[str, int] | None = None


def parse_ports(text: str, dport: bool) -> list[tuple[int, int] | str]:
    """``parse_port_name_number_or_range`` (Firewall.pm): ``22``, ``80:85``, ``ssh``, comma lists of at
    most 15 numbers (a range counts 2); for ``dport`` an ICMP type name too (kept as the name).
    Raises ValueError with PVE's text."""
    elements = text.split(",")
    if text != ",".join(e for e in elements if e != ""):
        raise ValueError("extraneous commas in list\n")
    out: list[tuple[int, int] | str] = []
    count, icmp = 0, False
    for item in (e for e in elements if e != ""):
        if m := re.fullmatch(r"([0-9]+):([0-9]+)", item):
            count += 2
            a, b = int(m.group(1)), int(m.group(2))
            for p in (a, b):
                if p > 65535:
                    raise ValueError(f"invalid port '{m.group(1) if p == a else m.group(2)}'\n")
            if a > b:
                raise ValueError(f"backwards range '{a}:{b}' not allowed, did you mean '{b}:{a}'?\n")
            out.append((a, b))
        elif re.fullmatch(r"[0-9]+", item):
            count += 1
            if int(item) > 65535:
                raise ValueError(f"invalid port '{item}'\n")
            out.append((int(item), int(item)))
        elif dport and (item in ICMP_TYPES or item in ICMPV6_TYPES):
            icmp = True
            out.append(item)
        elif item in _services():
            out.append((_services()[item], _services()[item]))
        else:
            raise ValueError(f"invalid port '{item}'\n")
    if icmp and count > 0:
        raise ValueError("ICMP ports not allowed in port range\n")
    if count > 15:
        raise ValueError("too many entries in port list (> 15 numbers)\n")
    return out


def _ip_error(elem: str) -> str:
    """Net::IP's error for an element it cannot read (ip_is_ipv4/ip_is_ipv6 texts)."""
    if not re.fullmatch(r"[0-9a-fA-F:.\-/ ]+", elem):
        return f"Invalid chars in IP {elem}"
    for q in elem.split("/")[0].split("."):
        if q.isdigit() and int(q) > 255:
            return f"Invalid quad in IP address {elem} - {q}"
    return f"Invalid IP address {elem}"


def parse_address_list(text: str) -> int | None:
    """``parse_address_list`` (Firewall.pm): ``+ipset`` and alias names pass (checked later), else a
    comma list of IPs / CIDRs, or one range ``a-b``; one IP version. Returns 4, 6 or None; raises
    ValueError with PVE's text."""
    import ipaddress

    if re.fullmatch(r"\+\S+", text):
        if len(text) > 65:
            raise ValueError("ipset name too long\n")
        return None
    if ALIAS_REF_RE.fullmatch(text):
        if len(text) > 64:
            raise ValueError("alias name too long\n")
        return None
    elements = text.split(",")
    if text != ",".join(e for e in elements if e != ""):
        raise ValueError("extraneous commas in list\n")
    version = None
    has_range = False
    for elem in (e for e in elements if e != ""):
        try:
            if "-" in elem:
                has_range = True
                a, b = (ipaddress.ip_address(x.strip()) for x in elem.split("-", 1))
                if a.version != b.version or int(a) > int(b):
                    raise ValueError
                v = a.version
            else:
                v = ipaddress.ip_network(elem, strict=True).version
        except ValueError:
            raise ValueError(f"invalid IP address: {_ip_error(elem)}\n") from None
        if version and v != version:
            raise ValueError(f"detected mixed ipv4/ipv6 addresses in address list '{text}'\n")
        version = v
    if has_range and len([e for e in elements if e]) > 1:
        raise ValueError("you can't use a range in a list\n")
    return version


def _fmt_addr(v: str) -> None:
    parse_address_list(v)


def _fmt_dport(v: str) -> None:
    parse_ports(v, True)


def _fmt_sport(v: str) -> None:
    parse_ports(v, False)


def _fmt_proto(v: str) -> None:
    """``pve_fw_verify_protocol_spec``: a name or a number of /etc/protocols."""
    if v and v not in PROTOCOLS and v not in PROTOCOL_IDS:
        raise ValueError(f"unknown protocol '{v}'\n")


def _fmt_icmp_type(v: str) -> None:
    if v in ICMP_TYPES or v in ICMPV6_TYPES or v == "":
        return
    raise ValueError(f"invalid icmp-type value '{v}'\n")


def _fmt_iface(v: str) -> None:
    """pve-common ``pve_verify_iface``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{1,20}([:.]\d+)?", v, re.IGNORECASE):
        raise ValueError(f"invalid network interface name '{v}'\n")


# the named formats of the rule parameters (registered into the schema validator, z9.sim.schema)
FORMATS = {"pve-fw-addr-spec": _fmt_addr, "pve-fw-dport-spec": _fmt_dport, "pve-fw-sport-spec": _fmt_sport,
           "pve-fw-protocol-spec": _fmt_proto, "pve-fw-icmp-type-spec": _fmt_icmp_type, "pve-iface": _fmt_iface}
