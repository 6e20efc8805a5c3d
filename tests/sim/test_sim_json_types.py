"""Numbers where PVE's JSON has numbers, strings where it has strings, through proxmoxer.

Perl's JSON encoder writes a scalar as it was last used: a string that was never used as a number
stays a JSON string, an ``int(...)`` or ``... + 0`` is a number, and a number used as a string (a
hash key, an interpolation) becomes a string. Each answer below cites where PVE makes its values.
"""

from __future__ import annotations

import time

from .conftest import wait_task


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def test_nextid_is_a_string(pve):
    # pve-manager PVE/API2/Cluster.pm nextid: "return $i if !defined($idlist->{$i})" — the hash lookup
    # uses $i as a key, which stringifies it: the number goes out as "101" (the schema says integer);
    # with ?vmid= it returns the parameter as it came in, a string
    assert pve.cluster.nextid.get() == "101"
    assert pve.cluster.nextid.get(vmid=777) == "777"


def test_config_values_are_typed_as_check_type_makes_them(pve):
    # qemu-server PVE/QemuServer.pm parse_vm_config → check_type: boolean → 1/0 (on|yes|true too),
    # integer → int($1), number → the string as read ("return $value if $value =~ …"), string →
    # the string (memory and agent are property strings: "2048", "1")
    vm = pve.nodes("pve1").qemu(100)
    vm.config.put(cpulimit="1.5", onboot="1", sockets=1, tablet=0, migrate_downtime="0.1", balloon=512)
    cfg = vm.config.get()
    assert cfg["cores"] == 2 and cfg["sockets"] == 1 and cfg["balloon"] == 512  # integer
    assert cfg["onboot"] == 1 and cfg["tablet"] == 0  # boolean
    assert cfg["cpulimit"] == "1.5" and cfg["migrate_downtime"] == "0.1"  # number: the string it was
    assert cfg["memory"] == "2048" and cfg["agent"] == "1"  # property strings
    assert cfg["tags"] == "z9-role-agent" and isinstance(cfg["digest"], str)
    assert pve.nodes("pve1").qemu(9000).config.get()["template"] == 1


def test_pending_rows_carry_the_typed_values(pve, wait):
    # pve-guest-common PVE/GuestHelpers.pm config_with_pending_array: value/pending are the parsed
    # config's ($conf->{$opt}, $conf->{pending}->{$opt}), typed by the same check_type; delete is 1|2
    vm = pve.nodes("pve1").qemu(100)  # running: cores is not hot-plugged, so it is pending
    vm.config.put(cores=4, cpulimit="2")
    rows = {r["key"]: r for r in vm.pending.get()}
    assert rows["cores"]["value"] == 2 and rows["cores"]["pending"] == 4
    assert rows["memory"]["value"] == "2048"
    assert rows["cpulimit"].get("pending", rows["cpulimit"].get("value")) == "2"


def test_status_current_numbers_and_flags(pve):
    # qemu-server PVE/QemuServer.pm vmstatus: vmid int($vmid), pid int(...), cpus/maxmem/maxdisk
    # computed, "serial => 1 if conf_has_serial", "template => 1"; PVE/API2/Qemu.pm vm_status adds
    # ha, clipboard ($vga->{clipboard}: null without one) and "agent => 1 if get_qga_key(enabled)"
    st = pve.nodes("pve1").qemu(100).status.current.get()
    for k in ("vmid", "pid", "cpus", "maxmem", "maxdisk", "mem", "uptime", "netin", "netout", "diskread"):
        assert _is_int(st[k]), k
    assert st["vmid"] == 100 and st["status"] == "running" and st["name"] == "z9-agent-dev-1"
    assert st["serial"] == 1 and st["agent"] == 1 and st["ha"] == {"managed": 0}
    assert "clipboard" in st and st["clipboard"] is None  # vga: serial0, no clipboard
    tpl = pve.nodes("pve1").qemu(9000).status.current.get()
    assert tpl["template"] == 1 and tpl["status"] == "stopped" and "pid" not in tpl
    # PVE/API2/Qemu.pm vmlist: vmstatus's rows alone (no ha, no agent)
    row = next(r for r in pve.nodes("pve1").qemu.get() if r["vmid"] == 100)
    assert "ha" not in row and "agent" not in row and row["serial"] == 1 and _is_int(row["maxmem"])


def test_cluster_resources_numbers(pve):
    # pve-manager PVE/API2Tools.pm extract_vm_stats: "vmid => $vmid + 0", "template => $d->[3] + 0",
    # every counter "+ 0"; extract_storage_stats: "shared => $scfg->{shared} || 0" (pve-storage
    # Plugin.pm parse_config sets 1 for @SHARED_STORAGE types), maxdisk/disk "+ 0"
    rows = pve.cluster.resources.get()
    vm = next(r for r in rows if r["type"] == "qemu" and r["vmid"] == 9000)
    assert vm["template"] == 1 and all(_is_int(vm[k]) for k in ("vmid", "maxmem", "maxdisk", "maxcpu", "uptime"))
    st = {r["storage"]: r for r in rows if r["type"] == "storage" and r["node"] == "pve1"}
    assert st["isos"]["shared"] == 1 and st["local"]["shared"] == 0 and _is_int(st["local"]["maxdisk"])
    node = next(r for r in rows if r["type"] == "node")
    assert _is_int(node["maxcpu"]) and _is_int(node["maxmem"]) and _is_int(node["uptime"])


def test_storage_list_numbers(pve):
    # pve-storage PVE/Storage.pm storage_info: shared "? 1 : 0", enabled "? 1 : 0", total/avail/used
    # int(...); API2/Storage/Status.pm index adds used_fraction (a division: a float)
    for s in pve.nodes("pve1").storage.get():
        assert all(_is_int(s[k]) for k in ("shared", "active", "enabled", "total", "used", "avail")), s
        assert isinstance(s["content"], str) and isinstance(s["used_fraction"], float)
    vols = pve.nodes("pve1").storage("local-lvm").content.get()
    assert all(_is_int(v["size"]) and _is_int(v["vmid"]) and isinstance(v["volid"], str) for v in vols)


def test_task_status_and_log_numbers(pve):
    # pve-common PVE/Tools.pm upid_decode: pid/pstart/starttime hex(...) (numbers), id/type/user the
    # regex's strings; pve-manager PVE/API2/Tasks.pm read_task_status adds status, upid, exitstatus
    # (strings); read_task_log: {n: count, t: line} and the envelope's total (numbers)
    upid = pve.nodes("pve1").qemu(9000).clone.post(newid=120, name="typed")
    st = wait_task(pve, upid)
    assert all(_is_int(st[k]) for k in ("pid", "pstart", "starttime")), st
    assert st["id"] == "9000" and st["exitstatus"] == "OK" and st["type"] == "qmclone"
    log = pve.nodes("pve1").tasks(upid).log.get()
    assert log and all(_is_int(e["n"]) and isinstance(e["t"], str) for e in log)
    row = next(t for t in pve.nodes("pve1").tasks.get() if t["upid"] == upid)
    assert _is_int(row["endtime"]) and _is_int(row["starttime"]) and row["status"] == "OK"


def test_agent_exec_numbers(pve):
    # qemu-server PVE/API2/Qemu/Agent.pm: exec returns QGA's {pid} (a JSON number); exec-status
    # converts QGA's JSON booleans to 1/0 ("if (JSON::is_bool(...)) ... ? 1 : 0"), exitcode a number
    vm = pve.nodes("pve1").qemu(100)
    pid = vm.agent.exec.post(command="hostname")["pid"]
    assert _is_int(pid)
    deadline = time.monotonic() + 10
    while not (st := vm.agent("exec-status").get(pid=pid))["exited"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert st["exited"] == 1 and _is_int(st["exitcode"]) and isinstance(st["out-data"], str)
