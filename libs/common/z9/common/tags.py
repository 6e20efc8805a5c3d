"""Proxmox tag rules and z9's identity/role tags (architecture §6).

Proxmox (proxmox-api.md, "Tags"; pve-common ``JSONSchema.pm`` format ``pve-tag-list``): one tag
matches ``[a-z0-9_][a-z0-9_+.-]*`` case-insensitively; input may be separated by ``;``, ``,`` or
spaces; PVE stores tags ``;``-joined, de-duplicated, lower-cased and sorted. Always compare tags
as a normalised set.
"""
from __future__ import annotations

import re

TAG_RE = re.compile(r"[a-z0-9_][a-z0-9_+.-]*")
ROLE_PREFIX = "z9-role-"
ROLE_CUSTOMER = "z9-role-customer"
ROLE_AGENT = "z9-role-agent"
ROLE_PLATFORM = "z9-role-platform"
MEMBER_PREFIX = "z9-member-"


def normalize_tags(raw: str | None) -> frozenset[str]:
    """Split a Proxmox tag string on ``;``, ``,`` and white space; lower-case; return a set."""
    if not raw:
        return frozenset()
    return frozenset(t.lower() for t in re.split(r"[;,\s]+", raw) if t)


def format_tags(tags: frozenset[str] | set[str]) -> str:
    """The stored Proxmox form: sorted, ``;``-joined. Raises ``ValueError`` on an invalid tag."""
    for t in tags:
        if not TAG_RE.fullmatch(t):
            raise ValueError(f"invalid characters in tag {t!r}")
    return ";".join(sorted(tags))


def identity_tag(resource_id: str) -> str:
    """``z9-id-<resource id>``, lower-case: the only way z9 recognises its own VM."""
    return f"z9-id-{resource_id.lower()}"


def roles(tags: frozenset[str]) -> frozenset[str]:
    """The ``z9-role-*`` tags in ``tags``."""
    return frozenset(t for t in tags if t.startswith(ROLE_PREFIX))


def platform_roles(tags: frozenset[str]) -> frozenset[str]:
    """Every role tag other than ``z9-role-customer``: agent, platform, or any unknown role."""
    return frozenset(r for r in roles(tags) if r != ROLE_CUSTOMER)


def member_tag(member: str) -> str:
    """``z9-member-<member>``: which of its owner's VMs a VM is (``main`` for a server's one VM)."""
    return f"{MEMBER_PREFIX}{member.lower()}"


def customer_vm_tags(resource_id: str, member: str = "main") -> frozenset[str]:
    """The exact tag set a customer VM of ``resource_id`` (member ``member``) carries."""
    return frozenset({identity_tag(resource_id), member_tag(member), ROLE_CUSTOMER})
