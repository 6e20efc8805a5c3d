"""A kind is one slice: everything the volume kind is lives in ``resources/z9/resources/volume/``, and
outside it only what no slice can hold names it — the list below, which the volume slice's README
states. A new file naming the volume kind outside its slice fails here: move it into the slice, or
reach it through the registry (a hook, a derived list)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what names the volume kind (its job kinds, quota unit, region settings, module, ids, the server
# delete's option) — not the word "volume", which Proxmox uses for any disk image
VOLUME_NAMES = re.compile(
    r"\bVolume(?:Create|Attach|Detach|Resize|Delete)\b|\bvolume_gib\b|\bvolume_storage\b|\bvolume_max_gib\b"
    r"|\bz9\.resources\.volume\b|resources/volume\b|\bvol_[0-9a-z]{6,}|\bdelete_volumes\b|\bVOLUME\b")

OUTSIDE = {
    "db/z9/db/migrations/0018_volumes.sql": "its table (a migration)",
    "db/z9/db/migrations/0029_volume_disk_volids.sql": "its disk's recorded volids (a migration)",
    "db/z9/db/schema.sql": "the schema snapshot, regenerated from the migrations",
    "db/z9/db/migrations/0020_quota_limits.sql": "the quota rows' migration mirrors the old per-unit columns",
    "libs/common/z9/common/settings.py": "its region settings volume_storage, volume_max_gib",
    "docs/settings.md": "generated from the settings model",
    "README.md": "the API's and quotas' rows, the walkthrough",
    "docs/architecture.md": "the layout's worked example of a slice",
}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_the_volume_kind_is_named_outside_its_slice_only_where_listed() -> None:
    found = set()
    for rel in _tracked():
        if rel.startswith(("tests/", "resources/z9/resources/volume/")):
            continue
        path = ROOT / rel
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        if VOLUME_NAMES.search(text) or (rel.endswith(".sql") and re.search(r"\bvolumes\b", text)):
            found.add(rel)
    assert found - set(OUTSIDE) == set(), "the volume kind named outside its slice"
    assert set(OUTSIDE) - found == set(), "listed but no longer naming it: drop from OUTSIDE"


def test_the_slice_readme_names_what_lies_outside() -> None:
    readme = (ROOT / "resources/z9/resources/volume/README.md").read_text()
    for rel in ("db/z9/db/migrations/0018_volumes.sql", "libs/common/z9/common/settings.py", "simulator/z9/sim/"):
        assert rel in readme


# what names the firewall kind: its job kinds, module, ids, its member table
FIREWALL_NAMES = re.compile(
    r"\bFirewall(?:Create|SetRules|ApplyToResources|RemoveFromResources|Delete)\b|\bz9\.resources\.firewall\b"
    r"|resources/firewall\b|\bfw_[0-9a-z]{6,}|\bfirewall_members\b")

FIREWALL_OUTSIDE = {
    "db/z9/db/migrations/0027_firewalls.sql": "its tables (a migration)",
    "db/z9/db/schema.sql": "the schema snapshot, regenerated from the migrations",
    "README.md": "the API's row, the walkthrough",
    "docs/architecture.md": "who owns what on a VM",
}


def test_the_firewall_kind_is_named_outside_its_slice_only_where_listed() -> None:
    found = set()
    for rel in _tracked():
        if rel.startswith(("tests/", "resources/z9/resources/firewall/")):
            continue
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        if FIREWALL_NAMES.search(text):
            found.add(rel)
    assert found - set(FIREWALL_OUTSIDE) == set(), "the firewall kind named outside its slice"
    assert set(FIREWALL_OUTSIDE) - found == set(), "listed but no longer naming it: drop from FIREWALL_OUTSIDE"
