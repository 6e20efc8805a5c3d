"""VolumeCreate: make the volume's disk (on its own anchor VM), and attach it when the row names a server.

The phases are :mod:`z9.resources.volume.jobs.shared`'s (one reconciler over the row's intent)."""
from __future__ import annotations

from z9.resources.volume import VOLUME_CREATE

from . import shared

KIND = VOLUME_CREATE
_phases = shared.phases(KIND)
observe = _phases.observe
plan = _phases.plan
apply = _phases.apply
verify = _phases.verify
record = _phases.record
record_failure = _phases.record_failure
