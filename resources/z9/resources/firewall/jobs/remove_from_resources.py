"""FirewallRemoveFromResources: servers taken off: the firewall's rules leave their VMs.

The phases are :mod:`z9.resources.firewall.jobs.shared`'s (one reconciler over the database's intent)."""
from __future__ import annotations

from z9.resources.firewall import FIREWALL_REMOVE

from . import shared

KIND = FIREWALL_REMOVE
_phases = shared.FirewallKind(KIND)
observe = _phases.observe
plan = _phases.plan
apply = _phases.apply
verify = _phases.verify
record = _phases.record
record_failure = _phases.record_failure
