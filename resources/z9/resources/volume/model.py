"""A volume's row as a typed object, and its public (API) JSON shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from z9.common.models import _ts, row_of

from .disks import volume_serial


@dataclass(frozen=True)
class Volume:
    """A row of ``volumes``."""

    id: str
    tenant_id: str
    region: str
    name: str
    size_gib: int
    storage: str
    server_id: str | None
    status: str
    status_reason: str | None
    status_before_delete: str | None
    server_before_delete: str | None
    delete_after: datetime | None
    observed: dict[str, Any] | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    # every volid the disk may have now, as z9 recorded it (verify's, and the steps' since): db migration 0029
    disk_volids: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_record(cls, r: Any) -> "Volume":
        return row_of(cls, r)

    def public(self) -> dict[str, Any]:
        """``GET /v1/volumes/{id}``."""
        obs = dict(self.observed) if self.observed else None
        if obs is not None:
            obs["at"] = _ts(self.observed_at)
        return {
            "id": self.id, "name": self.name, "region": self.region, "size_gib": self.size_gib,
            "server_id": self.server_id, "labels": dict(self.labels), "status": self.status,
            "status_reason": self.status_reason, "observed": obs,
            "linux_device": f"/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_{serial_of(self.id)}",
            "delete_after": _ts(self.delete_after), "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at), "deleted_at": _ts(self.deleted_at),
        }


def serial_of(volume_id: str) -> str:
    """The drive serial a volume's disk carries (``z9`` + the id's last 18 characters:
    :func:`z9.resources.volume.disks.volume_serial`): what the guest sees in lsblk and ``/dev/disk/by-id``."""
    return volume_serial(volume_id)
