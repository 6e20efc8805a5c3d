"""VolumeAttach: put the volume's disk on the server the row names (hot-plugged into a running one); also a cancelled deletion's restore.

The phases are :mod:`z9.resources.volume.jobs.shared`'s (one reconciler over the row's intent)."""
from __future__ import annotations

from z9.resources.volume import VOLUME_ATTACH

from . import shared

KIND = VOLUME_ATTACH
_phases = shared.phases(KIND)
observe = _phases.observe
plan = _phases.plan
apply = _phases.apply
verify = _phases.verify
record = _phases.record
record_failure = _phases.record_failure
