"""How a plan explains a VM's kept firewall rules differing (z9.executor.vms: the ``firewall`` step's
why): it names whose rules differ — the platform's, a tenant firewall's (``z9 firewall …`` comments,
the firewall type's declared rules), or both — never calling a tenant firewall's rule a platform rule."""
from __future__ import annotations

import z9.resources  # noqa: F401  (the registry: which type declares which rule prefix)
from z9.executor.vms import FwRule, _rules_differ
from z9.resources.firewall.compile import RULE_PREFIX

SSH = FwRule("in", "ACCEPT", "ssh", proto="tcp", dport="22")
HTTPS = FwRule("in", "ACCEPT", "fw_1 https", proto="tcp", dport="443", prefix=RULE_PREFIX)
WEB = FwRule("in", "ACCEPT", "fw_1 http", proto="tcp", dport="80", prefix=RULE_PREFIX)


def test_a_tenant_firewall_rule_removed_by_hand_is_named_as_the_firewalls() -> None:
    assert _rules_differ([SSH, HTTPS, WEB], [SSH.params(), HTTPS.params()]) == "z9 firewall rules differ"


def test_a_platform_rule_removed_by_hand_is_named_as_the_platforms() -> None:
    assert _rules_differ([SSH, HTTPS], [HTTPS.params()]) == "platform rules differ"


def test_both_differing_name_both_and_the_order_alone_says_so() -> None:
    assert _rules_differ([SSH, HTTPS], [WEB.params()]) == "platform and z9 firewall rules differ"
    assert _rules_differ([SSH, HTTPS], [HTTPS.params(), SSH.params()]) == "the order of z9's firewall rules differs"


def test_a_rule_z9_does_not_keep_is_left_out() -> None:
    by_hand = {"type": "in", "action": "ACCEPT", "enable": "1", "proto": "tcp", "dport": "8080", "comment": "mine"}
    assert _rules_differ([SSH, HTTPS, WEB], [SSH.params(), by_hand, HTTPS.params()]) == "z9 firewall rules differ"
