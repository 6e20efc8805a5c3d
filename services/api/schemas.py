"""Request bodies of the REST API (pydantic v2, unknown fields rejected)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

# A Proxmox VM name must be a DNS name (qemu-server: format 'dns-name'); z9 keeps to one label.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
SSH_KEY_PREFIXES = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-")


class ServerCreate(BaseModel):
    """``POST /v1/servers``. ``memory_mib`` in MiB, ``disk_gib`` in GiB (the boot disk's size;
    it can only grow from the image's size)."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(pattern=NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    image: StrictStr = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    cores: StrictInt = Field(ge=1, le=64)
    memory_mib: StrictInt = Field(ge=512, le=1048576)
    disk_gib: StrictInt = Field(ge=1, le=16384)
    ssh_keys: list[StrictStr] = Field(default_factory=list, max_length=32)

    @field_validator("ssh_keys")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        out = []
        for i, k in enumerate(keys):
            k = k.strip()
            if (not k.isascii() or not k.isprintable() or not k.startswith(SSH_KEY_PREFIXES)
                    or len(k.split()) < 2 or len(k) > 16384):
                raise ValueError(f"ssh_keys[{i}] is not a single OpenSSH public key line")
            out.append(k)
        return out
