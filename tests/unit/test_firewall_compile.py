"""The firewall compiler (pure): a tenant's rules → the PVE rules and policies z9 writes on a server's VM,
within what pve-firewall accepts (one address family a rule, address lists ≤ 512 characters, ports as
``a:b``, none for icmp/esp/gre)."""
from __future__ import annotations

from z9.resources.firewall.compile import (
    MAX_ADDRESS_TEXT,
    canonical_cidr,
    compile_rule,
    compile_server,
    effective_count,
    ipset_name,
    port_param,
)

FW = "fw_01jd3x5v8q2m6n4p7r9s1t3w5y"


def test_ports() -> None:
    assert port_param("80") == "80"
    assert port_param("80-85") == "80:85"
    assert port_param("any") is None and port_param(None) is None


def test_canonical_cidrs() -> None:
    assert canonical_cidr("10.1.2.3/8") == "10.0.0.0/8"
    assert canonical_cidr("10.1.2.3/32") == "10.1.2.3"
    assert canonical_cidr("2001:DB8:0:0::1/128") == "2001:db8::1"
    assert canonical_cidr("2001:db8::1/64") == "2001:db8::/64"


def test_anywhere_is_one_rule_without_source() -> None:
    [r] = compile_rule(FW, 0, {"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ["0.0.0.0/0", "::/0"]})
    assert r == {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "comment": f"z9 firewall {FW}: rule 0"}


def test_families_are_split_and_long_lists_chunked() -> None:
    v4 = [f"10.0.{i}.0/24" for i in range(60)]
    v6 = ["2001:db8::/32"]
    out = compile_rule(FW, 3, {"direction": "in", "protocol": "udp", "port": "53-54", "source_ips": v4 + v6,
                               "description": "dns"})
    assert all(r["dport"] == "53:54" and r["comment"] == f"z9 firewall {FW}: rule 3: dns" for r in out)
    sources = [r["source"] for r in out]
    assert all(len(s) <= MAX_ADDRESS_TEXT for s in sources)
    assert ",".join(s for s in sources if ":" not in s).split(",") == v4
    assert sources[-1] == "2001:db8::/32"
    assert len(out) == 3  # 60 v4 CIDRs (≈ 780 characters) in two lists, the v6 one apart


def test_only_one_family_open_to_anywhere() -> None:
    out = compile_rule(FW, 0, {"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ["0.0.0.0/0"]})
    assert [r["source"] for r in out] == ["0.0.0.0/0"]


def test_icmp_esp_gre_take_no_port_and_out_rules_a_destination() -> None:
    [r] = compile_rule(FW, 0, {"direction": "out", "protocol": "gre", "destination_ips": ["198.51.100.0/24"]})
    assert r == {"type": "out", "action": "ACCEPT", "proto": "gre", "dest": "198.51.100.0/24",
                 "comment": f"z9 firewall {FW}: rule 0"}
    [r] = compile_rule(FW, 1, {"direction": "in", "protocol": "icmp", "source_ips": ["192.0.2.7"]})
    assert "dport" not in r and r["source"] == "192.0.2.7"


def test_members_of_a_firewall_are_its_cluster_ip_set() -> None:
    other = "fw_01jd3x5v8q2m6n4p7r9s1t3w60"
    out = compile_rule(FW, 0, {"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [other]})
    assert [r["source"] for r in out] == [f"+dc/{ipset_name(other)}"]
    assert len(ipset_name(other)) <= 64


def test_policies_hetzners_semantics() -> None:
    assert compile_server([]) is None  # no firewall: the server kind's own policies stand
    ssh = {"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ["0.0.0.0/0", "::/0"]}
    only_in = compile_server([(FW, [ssh])])
    assert only_in is not None and (only_in.policy_in, only_in.policy_out) == ("DROP", None)
    empty = compile_server([(FW, [])])  # applied with no rules: inbound closed, nothing written
    assert empty is not None and empty.rules == () and empty.policy_in == "DROP"
    out = {"direction": "out", "protocol": "tcp", "port": "443", "destination_ips": ["0.0.0.0/0", "::/0"]}
    both = compile_server([("fw_b" + "0" * 25, [out]), (FW, [ssh])])
    assert both is not None and (both.policy_in, both.policy_out) == ("DROP", "DROP")
    # firewalls in id order, each one's rules in its order
    assert [r["comment"].split(":")[0] for r in both.rules] == [f"z9 firewall {FW}", "z9 firewall fw_b" + "0" * 25]


def test_effective_count() -> None:
    v6 = [f"2001:db8:aaaa:bbbb:cccc:dddd:{i:04x}:1" for i in range(100)]
    assert effective_count(FW, [{"direction": "in", "protocol": "tcp", "port": "1", "source_ips": v6}]) == 8
