"""Names z9 derives for the VMs it makes: every cluster member's VM name and hostname is one DNS
label (at most 63 characters) whatever the cluster and pool names the API accepts."""
from __future__ import annotations

import re

import yaml

from z9.common import pki
from z9.executor import vms
from z9.resources.cluster.jobs import shared as _cluster

from tests.unit.test_cluster_units import _cluster_row

LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # RFC 1035 §2.3.4, the API's NAME_PATTERN


def test_the_longest_names_the_api_accepts_make_a_label_per_member() -> None:
    """A 63-character cluster name and a 28-character pool made 94-character hostnames; the cluster
    name is shortened (its trailing hyphen dropped), the member part stays whole, members stay distinct."""
    pool = "p" * 27 + "9"  # 28: the longest pool name
    c = _cluster_row(name="a" * 30 + "-" + "b" * 32, control_plane={"count": 3},
                     node_pools=[{"name": pool, "count": 12}])
    members = _cluster.desired_members(c)
    names = [_cluster.vm_spec(c, m).name for m in members]
    assert all(LABEL.fullmatch(n) and len(n) <= 63 for n in names), [n for n in names if len(n) > 63]
    assert len(set(names)) == len(names) and names[-1].endswith(f"-{pool}-11")
    assert max(len(n) for n in names) == 63 and names[-1] == "a" * 30 + f"-{pool}-11"  # cut at its hyphen
    material = pki.new_cluster_pki()
    for m in (members[0], members[-1]):
        f = _cluster.bootstrap_files(c, material, m, None if m.name == "cp-0" else "abcdef.0123456789abcdef")
        user, meta = yaml.safe_load(f["user-data"]), yaml.safe_load(f["meta-data"])
        assert user["hostname"] == meta["local-hostname"] == _cluster.vm_spec(c, m).name


def test_short_names_are_unchanged() -> None:
    c = _cluster_row(name="prod")
    assert [_cluster.vm_spec(c, m).name for m in _cluster.desired_members(c)] == ["prod-cp-0", "prod-workers-0"]
    assert vms.dns_label("x" * 63, "cp-0") == "x" * 58 + "-cp-0"
