"""VolumeResize: grow the disk to the row's size where it is (online on a running server).

The phases are :mod:`z9.resources.volume.jobs.shared`'s (one reconciler over the row's intent)."""
from __future__ import annotations

from z9.resources.volume import VOLUME_RESIZE

from . import shared

KIND = VOLUME_RESIZE
_phases = shared.phases(KIND)
observe = _phases.observe
plan = _phases.plan
apply = _phases.apply
verify = _phases.verify
record = _phases.record
record_failure = _phases.record_failure
