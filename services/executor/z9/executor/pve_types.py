"""What the Proxmox adapter answers in and fails with, in z9's terms: the typed errors its single
boundary (:func:`z9.executor.proxmox.translate`) turns PVE's answers into, a task's UPID, a VM as
listed (:class:`VmRef`) and as read on its node (:class:`VmState`). No proxmoxer here: jobs and
tests import these without the client (z9.executor.proxmox imports them under the same names)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from z9.common.errors import PermanentError, Snooze, TemporaryError

UPID_RE = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9._-]+):(?P<pid>[0-9A-F]{8}):(?P<pstart>[0-9A-F]{8,9}):"
    r"(?P<starttime>[0-9A-F]{8}):(?P<type>[^:]*):(?P<id>[^:]*):(?P<user>[^:]+):"
)


class AgentUnavailable(TemporaryError):
    """The VM's guest agent does not answer (not configured, VM not running, still booting)."""


class ExecStatusLost(TemporaryError):
    """The guest agent no longer knows an ``exec``'s pid (``Invalid parameter 'pid'``): qemu-ga
    forgets a process once it reported its exit, so an ``exec-status`` whose answer was lost cannot
    be asked again — the command's result is gone (qemu-ga qmp_guest_exec_status: the process is
    removed from its list once ``exited`` was returned). Run the command again if it may be."""


class VmMissing(TemporaryError):
    """The VM's config file does not exist on that node (gone, moved, or never made)."""


class OutcomeUnknown(TemporaryError):
    """The request got no answer (timeout, connection dropped): it may or may not have been
    performed — and may still be (proxmox-api.md, Tasks: "observe again, never send blindly")."""


class VmidTaken(TemporaryError):
    """create/clone found the requested vmid taken (``already exists``): pick another."""


class EntryExists(PermanentError):
    """400 ``… already exists`` from an IP set (the set, or the entry): what was asked is there."""


class EntryMissing(PermanentError):
    """``no such IPSet '<name>'`` (500) or ``no such IP/Network`` (400): it is not there."""


class DigestMismatch(TemporaryError):
    """500 ``detected modified configuration - file changed by other user? Try again.`` (pve-common
    ``PVE::Tools::assert_if_modified``): the write named a digest the file no longer has — someone
    changed it since it was read. Nothing was written; read again, then write."""


class MissingPrivilege(PermanentError):
    """403 ``Permission check failed (<path>, <privilege>)``: the region's token lacks that privilege."""


class CloneNeedsSharedStorage(PermanentError):
    """``can't clone VM to node '…' (VM uses local storage)``: PVE refuses a clone with ``target=``
    another node for a source with a volume on a storage that is not shared — before any task
    (qemu-server API2/Qemu.pm clone_vm). Clone on the source's node, then migrate."""


class VmLocked(Snooze):
    """The VM holds a config lock (``clone``, ``backup``, …) set by another task."""


class _TaskFailure:
    """Fields of a failed hypervisor task: its UPID, ``exitstatus`` and last log lines."""

    def __init__(self, message: str, *, upid: str, exitstatus: str, log_tail: list[str]):
        super().__init__(message)  # type: ignore[call-arg]
        self.upid = upid
        self.exitstatus = exitstatus
        self.log_tail = log_tail


class TaskFailed(_TaskFailure, TemporaryError):
    """A hypervisor task stopped with an error ``exitstatus`` that a retry may fix."""


class TaskFailedPermanently(_TaskFailure, PermanentError):
    """A task failure that retrying cannot fix (e.g. ``shrinking disks is not supported``)."""


@dataclass(frozen=True)
class Upid:
    """A parsed UPID (pve-common ``UPID.pm``): node, pid, pstart, starttime, type, id, user."""

    raw: str
    node: str
    type: str
    id: str
    user: str

    @classmethod
    def parse(cls, raw: str) -> "Upid":
        """Raises PermanentError when ``raw`` is not a UPID."""
        m = UPID_RE.fullmatch(raw or "")
        if not m:
            raise PermanentError(f"not a UPID: {raw!r}")
        return cls(raw, m["node"], m["type"], m["id"], m["user"])


@dataclass(frozen=True)
class VmRef:
    """One entry of ``/cluster/resources?type=vm``. ``tags`` and ``lock`` are fresh; ``name``
    and ``status`` come from a stats cache that lags ~10 s (proxmox-api.md)."""

    vmid: int
    node: str
    name: str | None
    status: str | None
    tags: frozenset[str]
    lock: str | None
    template: bool


@dataclass(frozen=True)
class VmState:
    """A VM read on its node: config (with ``digest``), fresh tags, lock and power status."""

    vmid: int
    node: str
    config: dict[str, Any]
    status: str  # running | stopped
    tags: frozenset[str] = field(default_factory=frozenset)
    uptime_s: int | None = None  # seconds since the VM's QEMU process started (status/current)

    @property
    def lock(self) -> str | None:
        return self.config.get("lock")

    @property
    def running(self) -> bool:
        return self.status == "running"
