"""NoCloud seed ISOs: how z9 ships cloud-init data to a VM through the Proxmox API alone.

The Proxmox API cannot write cloud-init snippets (``upload`` accepts only ``iso``, ``vztmpl``,
``import``), so bootstrap data goes into an ISO 9660 image with the volume label ``cidata`` holding
``user-data``, ``meta-data`` and (optionally) ``network-config`` — cloud-init's NoCloud datasource —
uploaded with ``POST /nodes/{node}/storage/{storage}/upload`` (``content=iso``) and attached as a CD-ROM.
The layout is the one genisoimage builds for PVE's own drive (``-iso-level 3 -J -R -V cidata``):
ISO 9660 level 3 + Joliet + Rock Ridge, so every reader (blkid, the kernel's isofs, pycdlib) sees
the long names.

The bytes are **deterministic**: the same inputs give the same image (all timestamps are fixed to
``epoch``, default 2000-01-01 UTC), so a content-addressed name (``sha256(iso)``) or a checksum
computed before the upload is stable across retries.

Example::

    iso = build_nocloud_iso(user_data="#cloud-config\\n...", meta_data="instance-id: srv-123\\n",
                            network_config="version: 2\\n...")
    checksum = hashlib.sha256(iso).hexdigest()

:func:`read_nocloud_iso` reads such an image back (used by the simulator's guest and by tests).
"""

from __future__ import annotations

import io
import threading
import time as _time
import types

import pycdlib

LABEL = "cidata"
EPOCH_2000 = 946684800.0
_FILES = (("user-data", "USERDATA.;1"), ("meta-data", "METADATA.;1"), ("network-config", "NETWORKC.;1"),
          ("vendor-data", "VENDORDA.;1"))
_lock = threading.Lock()


class NoCloudError(ValueError):
    """The bytes are not a readable NoCloud seed ISO (named in the message)."""


def _fixed_time(epoch: float) -> types.SimpleNamespace:
    """A stand-in for the ``time`` module inside pycdlib: fixed clock, UTC local time."""
    return types.SimpleNamespace(time=lambda: epoch, localtime=lambda t=None: _time.gmtime(epoch if t is None else t),
                                 gmtime=_time.gmtime, strftime=_time.strftime, strptime=_time.strptime,
                                 mktime=_time.mktime, timezone=0, altzone=0, daylight=0)


def build_nocloud_iso(user_data: str | bytes, meta_data: str | bytes, network_config: str | bytes | None = None,
                      vendor_data: str | bytes | None = None, *, label: str = LABEL,
                      epoch: float = EPOCH_2000) -> bytes:
    """The ISO image's bytes (ISO 9660 level 3 + Joliet + Rock Ridge, volume label ``label``)."""
    contents = {"user-data": user_data, "meta-data": meta_data, "network-config": network_config,
                "vendor-data": vendor_data}
    fixed = _fixed_time(epoch)
    modules = [m for m in (getattr(pycdlib, n, None) for n in ("pycdlib", "headervd", "dates", "utils", "udf",
                                                               "inplaceeditor")) if m is not None]
    with _lock:  # pycdlib reads the clock through its modules' ``time`` attribute: fix it for this build
        saved = [(m, m.time) for m in modules if hasattr(m, "time")]
        try:
            for m, _ in saved:
                m.time = fixed
            iso = pycdlib.PyCdlib()
            iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=label)
            for name, iso_name in _FILES:
                data = contents[name]
                if data is None:
                    continue
                raw = data.encode() if isinstance(data, str) else bytes(data)
                iso.add_fp(io.BytesIO(raw), len(raw), f"/{iso_name}", rr_name=name, joliet_path=f"/{name}")
            out = io.BytesIO()
            iso.write_fp(out)
            iso.close()
        finally:
            for m, t in saved:
                m.time = t
    return out.getvalue()


def read_nocloud_iso(data: bytes) -> tuple[str, dict[str, bytes]]:
    """``(volume label, {file name: bytes})`` of an ISO image's root directory, names as Rock Ridge,
    else Joliet, else ISO 9660 (``;1`` and a trailing dot dropped, lower-cased) give them.

    Raises :class:`NoCloudError` when the bytes are not an ISO 9660 image."""
    iso = pycdlib.PyCdlib()
    try:
        iso.open_fp(io.BytesIO(data))
    except Exception as e:  # pycdlib raises PyCdlibInvalidInput and also struct/index errors on garbage
        raise NoCloudError(f"not an ISO 9660 image: {e}") from None
    try:
        label = iso.pvd.volume_identifier.decode("ascii", "replace").rstrip(" \x00")
        files: dict[str, bytes] = {}
        if iso.has_rock_ridge():
            facade, kind = iso.get_rock_ridge_facade(), "rr"
        elif iso.has_joliet():
            facade, kind = iso.get_joliet_facade(), "joliet"
        else:
            facade, kind = iso.get_iso9660_facade(), "iso"
        for child in facade.list_children("/"):
            if child is None or child.is_dot() or child.is_dotdot() or not child.is_file():
                continue
            if kind == "rr" and child.rock_ridge is not None:
                name = child.rock_ridge.name().decode()
            elif kind == "joliet":
                name = child.file_identifier().decode("utf-16_be")
            else:
                name = child.file_identifier().decode().split(";")[0].rstrip(".").lower()
            buf = io.BytesIO()
            facade.get_file_from_iso_fp(buf, f"/{name}" if kind != "iso" else
                                        "/" + child.file_identifier().decode())
            files[name] = buf.getvalue()
        return label, files
    except NoCloudError:
        raise
    except Exception as e:
        raise NoCloudError(f"unreadable ISO 9660 image: {e}") from None
    finally:
        iso.close()
