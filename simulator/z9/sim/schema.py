"""Request validation against the real Proxmox VE 9.1.3 API schema.

The schema (``pve-api-schema.json``, a tree of ``{path, text, leaf, children?, info?}``) ships with
this package. :class:`PveSchema` indexes it by ``(method, path template)`` and re-implements the parts
of pve-common ``PVE::JSONSchema::check_prop``/``check_type`` that decide whether PVE answers
``400 Parameter verification failed.``. Texts are the Perl texts, including the trailing newline of
messages that come from a ``die "...\\n"`` in a format validator (PVE returns them that way).

Checked, in PVE's order (``check_prop``): missing non-optional → ``property is missing and it is not
optional``; type (``integer``/``number`` regexes of ``is_integer``/``is_number``; ``boolean`` accepts
only ``1`` and ``0`` as ``check_type`` does, so Python's ``True`` → ``type check ('boolean') failed -
got 'True'``); format (``pve-tag-list``, ``urlencoded``, ``pve-vmid``, ``pve-node``, ``dns-name``,
``pve-configid``, ``pve-configid-list``, the firewall rule formats of :mod:`z9.sim.firewall`; every other
format is accepted) → ``invalid format - <msg>``;
pattern (anchored) → ``value does not match the regex pattern``; maxLength/minLength; maximum/minimum;
enum. Unknown parameters → ``property is not defined in schema and the schema does not allow additional
properties``. Path placeholders (``{node}``, ``{vmid}``, ``{upid}``, ...) are parameters too.

Usage::

    from z9.sim.schema import PveSchema
    template, errors = PveSchema.load().validate("POST", "/nodes/pve1/qemu/9000/clone", {"newid": "101"})
    # template is None -> 501 "Method 'POST /x' not implemented"; errors != {} -> 400
"""

from __future__ import annotations

import functools
import ipaddress
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from typing import Any

PARAM_ERROR = "Parameter verification failed."
MSG_UNKNOWN = "property is not defined in schema and the schema does not allow additional properties"
MSG_MISSING = "property is missing and it is not optional"

# pve-common PVE::JSONSchema
_TAG_RE = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*", re.I)
_URLENCODED_RE = re.compile(r"[-%a-zA-Z0-9_.!~*'()]*")
_VMID_RE = re.compile(r"[1-9][0-9]{2,8}")
_NODE_RE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")
_DNS_LABEL = r"([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
_DNS_RE = re.compile(rf"({_DNS_LABEL}\.)*{_DNS_LABEL}")
_CONFIGID_RE = re.compile(r"[a-z][a-z0-9_-]+", re.I)
_INT_RE = re.compile(r"[+-]?\d+")
_NUM_RE = re.compile(r"[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?")

# Highest index + 1 of the "name[n]" options of qemu-server (QemuServer.pm / Drive.pm constants).
_INDEX_LIMITS = {
    "net": 32, "ipconfig": 32, "scsi": 31, "virtio": 16, "sata": 6, "ide": 4, "unused": 256,
    "usb": 14, "hostpci": 16, "serial": 4, "parallel": 3, "numa": 8, "virtiofs": 10,
}


def split_list(text: str) -> list[str]:
    """PVE::Tools::split_list: separators are ``,`` ``;`` and whitespace; empty items dropped."""
    return [p for p in re.split(r"[,;\s]+", text or "") if p]


def _fmt_tag(v: str) -> None:
    if not _TAG_RE.fullmatch(v):
        raise ValueError("invalid characters in tag\n")


def _fmt_urlencoded(v: str) -> None:
    if not _URLENCODED_RE.fullmatch(v):
        raise ValueError(f"invalid urlencoded string: {v}\n")


def _fmt_vmid(v: str) -> None:
    if not _VMID_RE.fullmatch(v):
        raise ValueError("value does not look like a valid VM ID\n")


def _fmt_node(v: str) -> None:
    if not _NODE_RE.fullmatch(v):
        raise ValueError("value does not look like a valid node name\n")


def _fmt_dns(v: str) -> None:
    if not _DNS_RE.fullmatch(v):
        raise ValueError("value does not look like a valid DNS name\n")


def _fmt_configid(v: str) -> None:
    if not _CONFIGID_RE.fullmatch(v):
        raise ValueError(f"invalid configuration ID '{v}'\n")


def _fmt_ip_or_cidr(v: str) -> None:
    """pve-common ``pve_verify_ip_or_cidr``; Net::IP refuses host bits set under the prefix."""
    m = re.fullmatch(r"([0-9a-fA-F:.]+)(?:/(\d+))?", v)
    try:
        addr = ipaddress.ip_address(m.group(1)) if m else None
    except ValueError:
        addr = None
    if addr is None:
        raise ValueError("value does not look like a valid IP address or CIDR network\n")
    if m.group(2) is not None:
        prefix = int(m.group(2))
        if prefix > addr.max_prefixlen:
            raise ValueError(f"Invalid prefix length /{prefix}\n")
        try:
            ipaddress.ip_network(v, strict=True)
        except ValueError:
            bits = format(int(addr), f"0{addr.max_prefixlen}b")
            raise ValueError(f"Invalid prefix {bits}/{prefix}\n") from None


_ALIAS_RE = re.compile(r"(?:dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+")


def _fmt_ip_cidr_alias(v: str) -> None:
    """pve-firewall ``pve_verify_ip_or_cidr_or_alias``."""
    if _ALIAS_RE.fullmatch(v):
        return
    _fmt_ip_or_cidr(v)


def _fmt_storage_id(v: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9\-_.]*[a-z0-9]", v, re.I):
        raise ValueError(f"storage ID '{v}' contains illegal characters\n")


def _fmt_sdn_id(v: str) -> None:
    """pve-network ``VnetPlugin.pm`` / ``Zones/Plugin.pm``: the standard options ``pve-sdn-vnet-id`` and
    ``pve-sdn-zone-id`` are ``pattern => '[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]', minLength => 2, maxLength =>
    8`` (the shipped schema names them by format only); pve-common JSONSchema.pm check_type's texts."""
    if len(v) < 2:
        raise ValueError("value must be at least 2 characters long\n")
    if len(v) > 8:
        raise ValueError("value may only be 8 characters long\n")
    if not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]", v):
        raise ValueError("value does not match the regex pattern\n")


_FORMATS = {
    "pve-sdn-vnet-id": _fmt_sdn_id,
    "pve-sdn-zone-id": _fmt_sdn_id,
    "pve-storage-id": _fmt_storage_id,
    "pve-tag": _fmt_tag,
    "urlencoded": _fmt_urlencoded,
    "pve-vmid": _fmt_vmid,
    "pve-node": _fmt_node,
    "dns-name": _fmt_dns,
    "pve-configid": _fmt_configid,
    "IPorCIDR": _fmt_ip_or_cidr,
    "IPorCIDRorAlias": _fmt_ip_cidr_alias,
}


_IPV4_RE = r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


def _is_ipv6(v: str) -> bool:
    try:
        ipaddress.IPv6Address(v)
        return True
    except ValueError:
        return False


def _cidr_ok(v: str, six: bool) -> bool:
    """pve_verify_cidrv4/6: an address and a prefix of 8..32 (8..128)."""
    addr, sep, prefix = v.partition("/")
    if not sep or not prefix.isdigit():
        return False
    ok = _is_ipv6(addr) if six else re.fullmatch(_IPV4_RE, addr) is not None
    return ok and 8 <= int(prefix) <= (128 if six else 32)


# pve-qm-ipconfig (qemu-server Network.pm $ipconfig_fmt): key -> (validator, message)
_IPCONFIG_KEYS = {
    "ip": (lambda v: v in ("dhcp", "manual") or _cidr_ok(v, False),
           "value does not look like a valid ipv4 network configuration"),
    "gw": (lambda v: re.fullmatch(_IPV4_RE, v) is not None, "value does not look like a valid IPv4 address"),
    "ip6": (lambda v: v in ("dhcp", "auto", "manual") or _cidr_ok(v, True),
            "value does not look like a valid ipv6 network configuration"),
    "gw6": (_is_ipv6, "value does not look like a valid IPv6 address"),
}


def _fmt_ipconfig(v: str, path: str) -> None:
    """``parse_property_string($ipconfig_fmt, ...)``: one message as PVE::Exception stringifies it
    (``format error`` + one ``<path>.<key>: <error>`` line per bad key)."""
    seen: dict[str, str] = {}
    for part in v.split(","):
        if part == "":
            continue
        k, sep, val = part.partition("=")
        if not sep:
            raise ValueError("value without key, but schema does not define a default key\n")
        if k in seen:
            raise ValueError(f"duplicate key in comma-separated list property: {k}\n")
        seen[k] = val
    errs = []
    for k, val in seen.items():
        rule = _IPCONFIG_KEYS.get(k)
        if rule is None:
            errs.append(f"{path}.{k}: property is not defined in schema and the schema does not allow additional "
                        "properties\n")
        elif not rule[0](val):
            errs.append(f"{path}.{k}: invalid format - {rule[1]}\n")
    if errs:
        raise ValueError("format error\n" + "".join(errs))


_PATH_FORMATS = {"pve-qm-ipconfig": _fmt_ipconfig}


def parse_boolean(v: str) -> str | None:
    """pve-common JSONSchema.pm parse_boolean: 1/on/yes/true, 0/off/no/false (any case)."""
    if re.fullmatch(r"1|on|yes|true", v, re.I):
        return "1"
    if re.fullmatch(r"0|off|no|false", v, re.I):
        return "0"
    return None


def parse_property_string(fmt: dict, data: str, path: str) -> dict[str, str]:
    """pve-common PVE/JSONSchema.pm parse_property_string of a hash format (no additional
    properties): ``key=value`` parts (``alias``/``keyAlias`` remapped: ``virtio=<mac>`` is
    ``model=virtio,macaddr=<mac>``), one value without a key for the ``default_key``; then
    check_object of the result — errors raised as ``format error`` + one ``<path>.<key>: <msg>`` line
    each (as PVE::Exception stringifies them)."""
    res: dict[str, str] = {}
    default_key = None
    for part in data.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"([^=]+)=(.+)", part, re.S)
        if m:
            k, v = m.group(1), m.group(2)
            if k in res:
                raise ValueError(f"duplicate key in comma-separated list property: {k}\n")
            sch = fmt.get(k)
            if isinstance(sch, dict) and sch.get("alias"):
                if sch.get("keyAlias"):
                    ka = sch["keyAlias"]
                    if ka in res:
                        raise ValueError(f"key alias '{ka}' is already defined\n")
                    res[ka] = k
                k = sch["alias"]
                sch = fmt.get(k)
                if k in res:
                    raise ValueError(f"key '{k}' is already defined (via alias)\n")
            if not isinstance(sch, dict):
                raise ValueError(f"invalid key in comma-separated list property: {k}\n")
            if sch.get("type") == "boolean":
                v = parse_boolean(v) or v
            res[k] = v
        elif "=" not in part:
            if default_key:
                raise ValueError(f"duplicate key in comma-separated list property: {default_key}\n")
            default_key = next((k for k, sch in fmt.items() if isinstance(sch, dict) and sch.get("default_key")), None)
            if default_key is None:
                raise ValueError("value without key, but schema does not define a default key\n")
            if default_key in res:
                raise ValueError(f"duplicate key in comma-separated list property: {default_key}\n")
            sch = fmt[default_key]
            res[default_key] = (parse_boolean(part) or part) if sch.get("type") == "boolean" else part
        else:
            raise ValueError("missing key in comma-separated list property\n")
    errs = []
    for k, sch in sorted(fmt.items()):
        if not isinstance(sch, dict) or sch.get("alias"):
            continue
        msg = check_prop(res.get(k), sch, f"{path}.{k}")
        if msg is not None:
            errs.append(f"{path}.{k}: {msg}\n")
    if errs:
        raise ValueError("format error\n" + "".join(errs))
    return res


def _fmt_mac(v: str) -> None:
    # pve-common JSONSchema.pm pve_verify_mac_addr (the I/G bit must be clear)
    if not re.fullmatch(r"[a-f0-9][02468ace](?::[a-f0-9]{2}){5}", v, re.I):
        raise ValueError("value does not look like a valid unicast MAC address\n")


_FORMATS["mac-addr"] = _fmt_mac


def _register_firewall_formats() -> None:
    """pve-firewall's registered formats of the rule parameters (``pve-fw-addr-spec``,
    ``pve-fw-dport-spec`` …, ``Firewall.pm`` ``register_format``) and pve-common's ``pve-iface``."""
    from .firewall_formats import FORMATS

    _FORMATS.update(FORMATS)


_register_firewall_formats()


def check_format(fmt: Any, value: str, path: str = "") -> None:
    """PVE::JSONSchema::check_format for the formats the simulator knows; raises ValueError(msg)."""
    if isinstance(fmt, dict):
        parse_property_string(fmt, value, path)
        return
    if not isinstance(fmt, str):
        return
    if fmt in _PATH_FORMATS:
        _PATH_FORMATS[fmt](value, path)
        return
    m = re.fullmatch(r"(.*?)(?:-(list|opt))?", fmt)
    name, kind = m.group(1), m.group(2)
    fn = _FORMATS.get(name)
    if fn is None:
        return
    if kind == "list":
        for item in split_list(value):
            fn(item)
    elif kind == "opt":
        if value:
            fn(value)
    else:
        fn(value)


@functools.lru_cache(maxsize=None)
def perl_re(pattern: str) -> "re.Pattern[str]":
    """A schema ``pattern`` as PVE::JSONSchema matches it (``$value =~ m/^$pattern$/``, Perl). The
    shipped schema serialises compiled Perl regexes: ``(?^:…)`` is a group with the default flags and
    ``(?^i:…)`` one with ``i`` — Python's ``(?:…)`` / ``(?i:…)`` (19 parameters carry them; ``re``
    cannot compile them as they are)."""
    py = re.sub(r"\(\?\^([a-z]*):", lambda m: f"(?{m.group(1)}:" if m.group(1) else "(?:", pattern)
    return re.compile(py)


def _num(v: Any) -> float:
    return float(v)


def check_prop(value: str | None, schema: dict, path: str = "") -> str | None:
    """Return the PVE error text for one parameter, or None if it is valid."""
    if value is None:
        if not schema.get("optional") and not schema.get("alias"):
            return MSG_MISSING
        return None
    typ = schema.get("type")
    if isinstance(value, JsonRef):  # PVE::JSONSchema::check_type on a reference
        return f"type check ('{typ}') failed" if typ in ("array", "object") else \
            f"type check ('{typ}') failed - got {value.kind}"
    if isinstance(value, list):
        if typ == "array":
            items = schema.get("items") or {}
            refs = [x for x in value if isinstance(x, JsonRef)]
            return check_prop(refs[0], items, path) if refs and items.get("type") not in ("array", "object") else None
        return check_prop(value[-1] if value else "", schema, path)
    if typ == "boolean" and value not in ("1", "0"):
        return f"type check ('boolean') failed - got '{value}'"
    if typ == "integer" and not _INT_RE.fullmatch(value):
        return f"type check ('integer') failed - got '{value}'"
    if typ == "number" and not _NUM_RE.fullmatch(value):
        return f"type check ('number') failed - got '{value}'"
    if typ in ("array", "object"):
        return None  # never sent by the clients z9 uses; form data cannot carry them
    fmt = schema.get("format")
    if fmt:
        try:
            check_format(fmt, value, path)
        except ValueError as e:
            return f"invalid format - {e}"
    pattern = schema.get("pattern")
    if pattern and not perl_re(pattern).fullmatch(value):
        return "value does not match the regex pattern"
    if schema.get("maxLength") is not None and len(value) > int(schema["maxLength"]):
        return f"value may only be {schema['maxLength']} characters long"
    if schema.get("minLength") is not None and len(value) < int(schema["minLength"]):
        return f"value must be at least {schema['minLength']} characters long"
    if _NUM_RE.fullmatch(value):
        if schema.get("maximum") is not None and float(value) > _num(schema["maximum"]):
            return f"value must have a maximum value of {schema['maximum']}"
        if schema.get("minimum") is not None and float(value) < _num(schema["minimum"]):
            return f"value must have a minimum value of {schema['minimum']}"
    enum = schema.get("enum")
    if enum and value not in [str(e) for e in enum]:
        return f"value '{value}' does not have a value in the enumeration '{', '.join(map(str, enum))}'"
    return None


@dataclass
class Endpoint:
    """One (method, path template) of the schema."""

    method: str
    template: str
    properties: dict[str, dict]
    additional: bool
    indexed: list[tuple[re.Pattern, str, dict]] = field(default_factory=list)
    permissions: dict | None = None  # the method's ``permissions`` (checked by z9.sim.permissions)

    def lookup(self, name: str) -> dict | None:
        if name in self.properties:
            return self.properties[name]
        for rx, base, schema in self.indexed:
            m = rx.fullmatch(name)
            if m and int(m.group(1)) < _INDEX_LIMITS.get(base, 10**6):
                return schema
        return None


class _Node:
    __slots__ = ("literal", "param", "endpoints", "template")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] = {}
        self.param: tuple[str, _Node] | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.template: str = ""


class JsonRef(str):
    """A JSON body value that is an object or an array where the schema wants a scalar (or an object
    where it wants an array): to the Perl validator a HASH or ARRAY reference, which ``check_type``
    refuses. The text is only for display."""

    kind: str = "HASH"

    @classmethod
    def of(cls, value: Any) -> "JsonRef":
        ref = cls(json.dumps(value))
        ref.kind = "ARRAY" if isinstance(value, list) else "HASH"
        return ref


def stringify(value: Any) -> str:
    """How a JSON body value reaches the Perl validator: JSON booleans become 1/0."""
    if value is True:
        return "1"
    if value is False:
        return "0"
    if isinstance(value, str):
        return value  # a JsonRef stays one
    return str(value)


class PveSchema:
    """Index of the PVE API schema. Build once with :meth:`load` (cached)."""

    def __init__(self, tree: list[dict]):
        self._root = _Node()
        self.endpoints: dict[tuple[str, str], Endpoint] = {}
        for n in tree:
            self._add(n)

    @classmethod
    @functools.cache
    def load(cls) -> "PveSchema":
        text = importlib.resources.files("z9.sim").joinpath("pve-api-schema.json").read_text("utf-8")
        return cls(json.loads(text))

    def _add(self, node: dict) -> None:
        path = node["path"]
        cur = self._root
        for seg in [s for s in path.split("/") if s]:
            if seg.startswith("{") and seg.endswith("}"):
                if cur.param is None:
                    cur.param = (seg[1:-1], _Node())
                cur = cur.param[1]
            else:
                cur = cur.literal.setdefault(seg, _Node())
        cur.template = path
        for method, info in (node.get("info") or {}).items():
            params = info.get("parameters") or {}
            props = dict(params.get("properties") or {})
            ep = Endpoint(method, path, props, bool(params.get("additionalProperties")), permissions=info.get("permissions"))
            for name, schema in list(props.items()):
                m = re.fullmatch(r"([a-z0-9_-]+)\[n\]", name)
                if m:
                    del props[name]
                    ep.indexed.append((re.compile(re.escape(m.group(1)) + r"(\d+)"), m.group(1), schema))
            cur.endpoints[method] = ep
            self.endpoints[(method, path)] = ep
        for child in node.get("children") or []:
            self._add(child)

    def match(self, method: str, path: str) -> tuple[Endpoint | None, dict[str, str]]:
        """Find the endpoint for a concrete path (relative to /api2/json). Literal segments win."""
        segs = [s for s in path.split("/") if s]

        def rec(node: _Node, i: int, params: dict[str, str]):
            if i == len(segs):
                ep = node.endpoints.get(method)
                return (ep, params) if ep else None
            seg = segs[i]
            if seg in node.literal:
                r = rec(node.literal[seg], i + 1, params)
                if r:
                    return r
            if node.param is not None:
                name, child = node.param
                if name in ("cidr", "volume") and not child.literal and child.param is None:
                    # pve-firewall ({cidr}) and pve-storage ({volume}) register these with
                    # fragmentDelimiter '': they take the rest of the path, slashes included
                    # (.../ipset/z9/10.0.0.5/32, .../content/local:iso/seed.iso)
                    return rec(child, len(segs), {**params, name: "/".join(segs[i:])})
                return rec(child, i + 1, {**params, name: seg})
            return None

        r = rec(self._root, 0, {})
        return r if r else (None, {})

    def validate(
        self, method: str, path: str, params: dict[str, Any]
    ) -> tuple[str | None, dict[str, str]]:
        """Validate one request.

        ``path`` is the concrete path after ``/api2/json`` (e.g. ``/nodes/pve1/qemu/100/config``),
        ``params`` the query/form parameters (values are converted with :func:`stringify`).
        Returns ``(template, errors)``: ``template`` is None when PVE would answer 501; ``errors`` maps
        parameter name → PVE error text (empty when valid). Path placeholders are validated as
        parameters (a query parameter may not override them).
        """
        ep, path_params = self.match(method.upper(), path)
        if ep is None:
            return None, {}
        values = {k: (v if isinstance(v, list) else stringify(v)) for k, v in params.items() if v is not None}
        values.update(path_params)
        errors: dict[str, str] = {}
        for name, schema in ep.properties.items():
            err = check_prop(values.get(name), schema, name)
            if err:
                errors[name] = err
        for name, value in values.items():
            if name in ep.properties:
                continue
            schema = ep.lookup(name)
            if schema is None:
                if not ep.additional:
                    errors[name] = MSG_UNKNOWN
                continue
            err = check_prop(value, schema, name)
            if err:
                errors[name] = err
        for name in values:  # PVE::JSONSchema::check_object: a present property may require another
            schema = ep.properties.get(name) or {}
            req = schema.get("requires")
            if isinstance(req, str) and values.get(req) is None and req not in errors:
                errors[req] = f"missing property - '{name}' requires this property"
        return ep.template, errors
