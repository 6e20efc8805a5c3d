"""VolumeDetach: take the volume's disk off its server, back to its anchor; also the first phase of its deletion, and of its server's.

The phases are :mod:`z9.resources.volume.jobs.shared`'s (one reconciler over the row's intent)."""
from __future__ import annotations

from z9.resources.volume import VOLUME_DETACH

from . import shared

KIND = VOLUME_DETACH
_phases = shared.phases(KIND)
observe = _phases.observe
plan = _phases.plan
apply = _phases.apply
verify = _phases.verify
record = _phases.record
record_failure = _phases.record_failure
