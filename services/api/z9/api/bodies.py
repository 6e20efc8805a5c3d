"""The request and answer bodies the API shares with its client (:mod:`z9.client`): what
``z9 servers create`` and ``z9 tokens create`` send is validated by these very models, the API's
own rules (:mod:`z9.api.schemas` and :mod:`z9.api.tokens` re-export them).

This module imports pydantic only (no aiohttp, asyncpg, store: the client starts fast);
``ServerCreate``'s key check loads :mod:`z9.common.sshkeys` when it has a key to check.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, WithJsonSchema, field_validator

# A Proxmox VM name must be a DNS name (qemu-server: format 'dns-name'); z9 keeps to one label.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
#: what a pattern means, in words, for the 422 that refuses a value (pydantic alone says
#: "String should match pattern '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'")
PATTERN_WORDS: dict[str, str] = {
    NAME_PATTERN: "a DNS label: 1-63 lower-case letters, digits and '-', not starting or ending with '-'",
    r"^[a-z][a-z0-9-]{0,27}$": "1-28 lower-case letters, digits and '-', starting with a letter",
    r"^[a-z0-9][a-z0-9-]{0,62}$": "1-63 lower-case letters, digits and '-', not starting with '-'",
}
_ID_PATTERN = re.compile(r"\^([a-z0-9]+)_\[0-9a-z\]\{26\}\$")


def pattern_words(pattern: str) -> str | None:
    """The words for a field's pattern (an id pattern ``^srv_[0-9a-z]{26}$`` → "an id: srv_ and 26
    lower-case letters or digits"), or None when it has none."""
    if pattern in PATTERN_WORDS:
        return PATTERN_WORDS[pattern]
    m = _ID_PATTERN.fullmatch(pattern)
    return f"an id: {m[1]}_ and 26 lower-case letters or digits" if m else None
SSH_KEY_PREFIXES = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-")



# One OpenSSH public key line (as ``ssh_keys`` accepts it: trimmed, printable ASCII, a key type
# then at least one more field). Around it: spaces, tabs and line ends only, spelt out — ``\s``
# is another set in each regex dialect (ECMA-262, the Rust engine of validators, Python's
# ``str.strip``), so the document and the API would disagree on its edges.
SSH_KEY_SPACE = " \t\r\n"
SSH_KEY_MAX = 16384  # characters, the surrounding space included (the document's maxLength)
SSH_KEY_PATTERN = r"^[ \t\r\n]*(ssh-|ecdsa-sha2-|sk-ssh-|sk-ecdsa-)[!-~]*( +[!-~]+)+[ \t\r\n]*$"


# ---------------------------------------------------------------------------------- servers

# Labels (every resource type, migration 0011): Kubernetes' syntax, without key prefixes' DNS
# subdomains longer than one name: a key is 1-63 characters ``[A-Za-z0-9._-]`` (optionally
# ``prefix/``), starting and ending alphanumeric; a value 0-63 of the same.
LABEL_KEY = r"^([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$"
LabelKey = Annotated[str, Field(pattern=LABEL_KEY, max_length=127)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]
# (the document says it with propertyNames: pydantic's patternProperties would let keys that
# do not match through with any value)
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=64, description="labels: key → value (at most 64)"),
                   WithJsonSchema({"type": "object", "maxProperties": 64, "description": "labels: key → value (at most 64)",
                                   "propertyNames": {"pattern": LABEL_KEY, "maxLength": 127},
                                   "additionalProperties": {"type": "string", "pattern": LABEL_VALUE, "maxLength": 63}})]


class NetworkJoin(BaseModel):
    """A private network a server joins at its create (``networks`` of ``POST /v1/servers``)."""

    model_config = ConfigDict(extra="forbid")

    network_id: StrictStr = Field(pattern=r"^net_[0-9a-z]{26}$")
    ip: StrictStr | None = Field(None, pattern=r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                                               r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$",
                                 description="an IPv4 address of the network's range; none: the lowest free one")


class ServerCreate(BaseModel):
    """``POST /v1/servers``. ``memory_mib`` in MiB, ``disk_gib`` in GiB (the boot disk's size;
    it can only grow from the image's size)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "web-1", "region": "dev-1", "image": "debian-12", "cores": 2, "memory_mib": 2048,
        "disk_gib": 20, "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"]}]})

    name: StrictStr = Field(pattern=NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    image: StrictStr = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    cores: StrictInt = Field(ge=1, le=64)
    memory_mib: StrictInt = Field(ge=512, le=1048576)
    disk_gib: StrictInt = Field(ge=1, le=16384)
    ssh_keys: list[Annotated[StrictStr, WithJsonSchema({"type": "string", "pattern": SSH_KEY_PATTERN,
                                                         "maxLength": SSH_KEY_MAX})]] = Field(default_factory=list,
                                                                                        max_length=32)
    public_ipv4: StrictBool | Annotated[StrictStr, Field(pattern=r"^adr_[0-9a-z]{26}$")] = Field(
        False, description="true: a primary IPv4 address from the region's pool (the lowest free IP), "
                           "written as cloud-init ipconfig0; or the id of an unassigned address of the "
                           "region to use as the primary; false: DHCP")
    networks: list[NetworkJoin] = Field(default_factory=list, max_length=8, description=(
        "private networks of the region to join at once: a NIC on each (net1, net2, …) with the address "
        "asked for or the lowest free one"))
    labels: Labels | None = Field(None, description="the server's labels from the start (a firewall whose label "
                                                    "selector matches them applies before its VM first starts)")

    @field_validator("ssh_keys")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        out = []
        for i, raw in enumerate(keys):
            k = raw.strip(SSH_KEY_SPACE)
            if (not k.isascii() or not k.isprintable() or not k.startswith(SSH_KEY_PREFIXES)
                    or len(k.split()) < 2 or len(raw) > SSH_KEY_MAX):
                raise ValueError(f"ssh_keys[{i}] is not a single OpenSSH public key line")
            # What the document's pattern cannot say (z9.common.sshkeys): Proxmox refuses a key
            # ssh-keygen cannot read, and writes each key unquoted into its cloud-init user-data.
            from z9.common import sshkeys  # here, not at import: cryptography is only needed for a key

            why = sshkeys.unreadable(k)
            if why:
                raise ValueError(f"ssh_keys[{i}] is {why}")
            if sshkeys.breaks_user_data(k):
                raise ValueError(f"ssh_keys[{i}]: its comment holds YAML syntax (': ', ' #' or a trailing ':') "
                                 "that breaks the cloud-init user-data Proxmox writes; change or drop the comment")
            out.append(k)
        return out


# ---------------------------------------------------------------------------------- tokens

class TokenCreate(BaseModel):
    """``POST /v1/tokens``: a token for the caller's tenant. ``scopes``: ``read`` and/or
    ``write`` (at most the caller's own); ``expires_in_s``: seconds until it stops working
    (none: until revoked)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "ci", "scopes": ["read"], "expires_in_s": 86400}]})

    name: StrictStr = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    scopes: list[Literal["read", "write"]] = Field(default_factory=lambda: ["read", "write"], min_length=1,
                                                   max_length=2)
    expires_in_s: StrictInt | None = Field(default=None, ge=60, le=5 * 366 * 86400)


class Token(BaseModel):
    """A token as listed (never its secret)."""

    id: str
    name: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    created_by: str | None = None


class TokenCreated(BaseModel):
    """The answer to ``POST /v1/tokens``: the token and its secret, shown this once."""

    token: Token
    secret: str
