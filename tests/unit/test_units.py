"""Pure unit tests (no database, no simulator): backoff, tags, ids, the job kinds' pure ``plan``
functions on hand-built worlds, and the Proxmox adapter's pure helpers (error translation,
UPID parsing, ssh key encoding)."""
from __future__ import annotations

import math
import random
import re
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote

import pytest
import requests
from proxmoxer.core import ResourceException

from z9.common.backoff import backoff_delay_s
from z9.common.errors import GuardRefusal, PermanentError, Snooze, TemporaryError
from z9.common.ids import is_id, new_id, prefixes
from z9.common.models import Job
from z9.common.tags import (
    ROLE_AGENT,
    ROLE_CUSTOMER,
    ROLE_PLATFORM,
    customer_vm_tags,
    format_tags,
    identity_tag,
    normalize_tags,
    platform_roles,
    roles,
)
from z9.resources.server.jobs import create as server_create
from z9.resources.server.jobs import delete as server_delete
from z9.resources.server.jobs import start as server_start
from z9.resources.server.jobs import stop as server_stop
from z9.executor.vms import encode_ssh_keys
from z9.executor.proxmox import (
    Upid,
    VmidTaken,
    VmLocked,
    VmMissing,
    VmRef,
    VmState,
    translate,
)

PVE_TAG_RE = re.compile(r"^[a-z0-9_][a-z0-9_+.-]*$")


# ================================================================== backoff

class TestBackoff:
    def test_attempt_one_is_base_without_jitter(self) -> None:
        assert backoff_delay_s(1, base_s=2.0, cap_s=300.0, jitter=0.0) == 2.0

    def test_attempt_one_is_base_plus_minus_jitter(self) -> None:
        rng = random.Random(1)
        for _ in range(500):
            d = backoff_delay_s(1, base_s=2.0, cap_s=300.0, jitter=0.25, rng=rng)
            assert 1.5 <= d <= 2.5

    def test_doubling(self) -> None:
        got = [backoff_delay_s(n, base_s=2.0, cap_s=1e9, jitter=0.0) for n in range(1, 9)]
        assert got == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]

    def test_cap(self) -> None:
        # base 2 s: attempt 9 would be 512 s, capped at 300 s; so is everything after it.
        assert backoff_delay_s(8, jitter=0.0) == 256.0
        for n in (9, 10, 20, 63, 64, 65):
            assert backoff_delay_s(n, jitter=0.0) == 300.0
        # The cap applies before the jitter: a jittered delay stays within cap · (1 ± j).
        rng = random.Random(7)
        for _ in range(200):
            assert 225.0 <= backoff_delay_s(30, rng=rng) <= 375.0

    def test_defaults_follow_the_architecture(self) -> None:
        # base 2 s, cap 300 s, jitter ±25 %
        assert backoff_delay_s(1, jitter=0.0) == 2.0
        assert backoff_delay_s(100, jitter=0.0) == 300.0
        rng = random.Random(3)
        values = [backoff_delay_s(1, rng=rng) for _ in range(2000)]
        assert min(values) >= 1.5 and max(values) <= 2.5
        assert min(values) < 1.55 and max(values) > 2.45  # the full ±25 % range is used

    def test_jitter_bounds_with_seeded_rng(self) -> None:
        for j in (0.01, 0.1, 0.5, 0.99):
            rng = random.Random(42)
            for n in (1, 3, 6):
                raw = min(300.0, 2.0 * 2 ** (n - 1))
                for _ in range(300):
                    d = backoff_delay_s(n, jitter=j, rng=rng)
                    assert raw * (1 - j) <= d <= raw * (1 + j)

    def test_seeded_rng_is_deterministic(self) -> None:
        a = [backoff_delay_s(n, rng=random.Random(5)) for n in range(1, 12)]
        b = [backoff_delay_s(n, rng=random.Random(5)) for n in range(1, 12)]
        assert a == b

    def test_jitter_zero_is_exact(self) -> None:
        rng = random.Random(0)
        for n in range(1, 40):
            assert backoff_delay_s(n, base_s=0.2, cap_s=2.0, jitter=0.0, rng=rng) == min(2.0, 0.2 * 2 ** (n - 1))

    @pytest.mark.parametrize("attempt", [0, -1, -100])
    def test_attempt_below_one_raises(self, attempt: int) -> None:
        with pytest.raises(ValueError):
            backoff_delay_s(attempt)

    @pytest.mark.parametrize("jitter", [1.0, 1.5, -0.01, -1.0])
    def test_jitter_out_of_range_raises(self, jitter: float) -> None:
        with pytest.raises(ValueError):
            backoff_delay_s(1, jitter=jitter)

    @pytest.mark.parametrize("attempt", [1025, 10_000, 10 ** 9, 10 ** 100])
    def test_huge_attempts_do_not_overflow(self, attempt: int) -> None:
        d = backoff_delay_s(attempt, jitter=0.0)
        assert d == 300.0
        d = backoff_delay_s(attempt, rng=random.Random(1))
        assert math.isfinite(d) and 225.0 <= d <= 375.0
        # even with a tiny base and a huge cap nothing overflows
        assert math.isfinite(backoff_delay_s(attempt, base_s=1e-3, cap_s=1e300, jitter=0.0))


# ================================================================== tags

class TestTags:
    def test_normalize_splits_and_lowercases(self) -> None:
        assert normalize_tags("a;b,c d") == {"a", "b", "c", "d"}
        assert normalize_tags("Z9-Role-Customer;;  z9-ID-srv_X,\tfoo\nBAR") == {
            "z9-role-customer", "z9-id-srv_x", "foo", "bar"}
        assert normalize_tags(" ;a; ,b ; ") == {"a", "b"}

    def test_normalize_deduplicates_and_handles_empty(self) -> None:
        assert normalize_tags("a;A;a") == {"a"}
        assert normalize_tags(None) == frozenset()
        assert normalize_tags("") == frozenset()
        assert normalize_tags(" ; , ") == frozenset()
        assert isinstance(normalize_tags("a"), frozenset)

    def test_format_is_sorted_and_semicolon_joined(self) -> None:
        assert format_tags({"zeta", "alpha", "z9-id-srv_1", "beta"}) == "alpha;beta;z9-id-srv_1;zeta"
        assert format_tags(frozenset()) == ""
        tags = normalize_tags("c,B;a")
        assert format_tags(tags) == "a;b;c"
        assert normalize_tags(format_tags(tags)) == tags  # round trip

    @pytest.mark.parametrize("bad", ["has space", "semi;colon", "-leading-dash", "", "Upper", "é", "a/b",
                                     "comma,"])
    def test_format_rejects_invalid_tags(self, bad: str) -> None:
        with pytest.raises(ValueError):
            format_tags({"ok", bad})

    def test_format_rejects_trailing_newline(self) -> None:
        with pytest.raises(ValueError):
            format_tags({"abc\n"})

    def test_identity_tag(self) -> None:
        assert identity_tag("srv_01abc") == "z9-id-srv_01abc"
        assert identity_tag("SRV_01ABC") == "z9-id-srv_01abc"
        sid = new_id("srv")
        assert PVE_TAG_RE.match(identity_tag(sid))
        assert format_tags(customer_vm_tags(sid)) == f"z9-id-{sid};z9-member-main;z9-role-customer"
        assert format_tags(customer_vm_tags(sid, "cp-0")) == f"z9-id-{sid};z9-member-cp-0;z9-role-customer"

    def test_roles_and_platform_roles(self) -> None:
        tags = frozenset({"z9-id-srv_1", ROLE_CUSTOMER, ROLE_AGENT, ROLE_PLATFORM, "z9-role-dns",
                          "z9-rolex", "other"})
        assert roles(tags) == {ROLE_CUSTOMER, ROLE_AGENT, ROLE_PLATFORM, "z9-role-dns"}
        # any z9-role-* other than customer is a platform role, including unknown future roles
        assert platform_roles(tags) == {ROLE_AGENT, ROLE_PLATFORM, "z9-role-dns"}
        assert platform_roles(frozenset({ROLE_CUSTOMER, "z9-id-srv_1"})) == frozenset()
        assert platform_roles(frozenset({"z9-role-anything-new"})) == {"z9-role-anything-new"}
        assert platform_roles(normalize_tags("Z9-ROLE-AGENT")) == {ROLE_AGENT}


# ================================================================== ids

class TestIds:
    @pytest.mark.parametrize("prefix", prefixes())
    def test_prefix_and_length(self, prefix: str) -> None:
        v = new_id(prefix)
        head, _, body = v.partition("_")
        assert head == prefix
        assert len(body) == 26
        assert is_id(v) and is_id(v, prefix)
        assert PVE_TAG_RE.match(v)
        assert PVE_TAG_RE.match(identity_tag(v))

    def test_unknown_prefix_raises(self) -> None:
        with pytest.raises(ValueError):
            new_id("vm")

    def test_unique(self) -> None:
        ids = {new_id("job") for _ in range(5000)}
        assert len(ids) == 5000

    def test_sortable_by_time(self) -> None:
        times = sorted([0, 1, 2, 31, 32, 1000, 2 ** 40, 1_700_000_000_000, 1_700_000_000_001, 2 ** 47,
                        2 ** 48 - 1])
        ids = [new_id("srv", now_ms=t) for t in times]
        assert ids == sorted(ids)
        # many ids per millisecond: still ordered across milliseconds
        many = [(t, new_id("job", now_ms=t)) for t in range(1_700_000_000_000, 1_700_000_000_050) for _ in range(5)]
        random.Random(0).shuffle(many)
        by_id = sorted(many, key=lambda p: p[1])
        assert [t for t, _ in by_id] == sorted(t for t, _ in many)

    def test_now_ms_defaults_to_the_clock(self) -> None:
        before = int(datetime.now(timezone.utc).timestamp() * 1000)
        v = new_id("srv")
        after = int(datetime.now(timezone.utc).timestamp() * 1000)
        assert new_id("srv", now_ms=before - 1) < v < new_id("srv", now_ms=after + 1)

    def test_is_id(self) -> None:
        good = "srv_" + "0123456789abcdefghjkmnpqrs"
        assert is_id(good)
        assert is_id(good, "srv")
        assert not is_id(good, "job")
        assert not is_id(good.upper())
        assert not is_id(good[:-1])  # 25 chars
        assert not is_id(good + "t")  # 27 chars
        for letter in "ilou":  # not in Crockford base32
            assert not is_id("srv_" + letter * 26)
        assert not is_id("vm_" + "0" * 26)
        assert not is_id("srv-" + "0" * 26)
        assert not is_id("")
        assert not is_id("srv_x")
        assert not is_id("job_bogus")

    def test_is_id_rejects_trailing_newline(self) -> None:
        assert not is_id("srv_" + "0123456789abcdefghjkmnpqrs" + "\n")


# ================================================================== job plans

NODE = "pve1"
SSH_KEYS = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"]


def make_job(kind: str, resource_id: str, args: dict[str, Any] | None = None, **over: Any) -> Job:
    now = datetime.now(timezone.utc)
    fields: dict[str, Any] = dict(
        id=new_id("job"), seq=1, kind=kind, region="dev-1", tenant_id=new_id("ten"),
        resource_type="server", resource_id=resource_id, args=args or {}, status="running", attempt=1,
        max_attempts=10, run_after=now, lease_owner="test-worker", lease_expires_at=now, steps=[], memo={},
        error=None, trace_context=None, created_at=now, started_at=now, finished_at=None, updated_at=now)
    fields.update(over)
    return Job(**fields)


def create_args(**over: Any) -> dict[str, Any]:
    args = {"name": "web-1", "region": "dev-1", "image": "debian-12", "cores": 2, "memory_mib": 2048,
            "disk_gib": 10, "ssh_keys": list(SSH_KEYS)}
    args.update(over)
    return args


def template() -> VmRef:
    return VmRef(vmid=9000, node=NODE, name="debian-12", status="stopped", tags=frozenset(), lock=None,
                 template=True)


def vm(vmid: int = 101, *, tags: str | None, status: str = "running", **config: Any) -> VmState:
    cfg: dict[str, Any] = {"digest": "0" * 40}
    if tags is not None:
        cfg["tags"] = tags
    cfg.update(config)
    return VmState(vmid=vmid, node=NODE, config=cfg, status=status, tags=normalize_tags(tags))


def converged_vm(sid: str, *, tags: str | None = None, status: str = "running", **config: Any) -> VmState:
    """A VM exactly as ServerCreate leaves it for ``create_args()``."""
    cfg: dict[str, Any] = {
        "name": "web-1", "cores": 2, "memory": "2048", "ipconfig0": "ip=dhcp", "protection": "1",
        "sshkeys": encode_ssh_keys(SSH_KEYS),
        "scsi0": "local-lvm:vm-101-disk-0,size=10G",
        "ide2": "local-lvm:vm-101-cloudinit,media=cdrom",
        "description": f"z9 resource {sid}",
    }
    cfg.update(config)
    return vm(101, tags=tags if tags is not None else format_tags(customer_vm_tags(sid)), status=status, **cfg)


def names(steps: list[Any]) -> list[str]:
    return [s.name for s in steps]


class TestServerCreatePlan:
    def test_no_vm_clones_configures_resizes_starts(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(), vm=None)
        # its firewall (explicit policies) before its first start
        assert names(server_create.plan(make_job("ServerCreate", sid, create_args()), world)) == [
            "clone", "configure", "resize_disk", "firewall", "start"]

    def test_missing_template_is_waited_for(self) -> None:
        """Not visible yet (imported moments ago, being renamed) is waiting on the world, never a
        permanent failure (issue 8; the wait is bounded by snooze_limit_s)."""
        sid = new_id("srv")
        world = server_create.World(template=None, vm=None)
        with pytest.raises(Snooze) as ei:
            server_create.plan(make_job("ServerCreate", sid, create_args(image="nope-9")), world)
        assert "nope-9" in str(ei.value)

    def test_vm_under_clone_lock_waits_for_the_clone_first(self) -> None:
        sid = new_id("srv")
        cloning = vm(130, tags=None, status="stopped", lock="clone")
        for tpl in (template(), None):
            steps = server_create.plan(make_job("ServerCreate", sid, create_args()),
                                       server_create.World(template=tpl, vm=cloning))
            assert names(steps)[0] == "wait_clone"
            assert steps[0].detail["vmid"] == 130
            assert names(steps) == ["wait_clone", "configure", "resize_disk", "firewall", "start"]

    def test_converged_vm_gives_empty_plan(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(), vm=converged_vm(sid))
        assert server_create.plan(make_job("ServerCreate", sid, create_args()), world) == []

    @pytest.mark.parametrize("fmt", [
        "z9-role-customer;z9-member-main;{id}",
        "{ID};Z9-ROLE-CUSTOMER;Z9-MEMBER-MAIN",
        "Z9-Role-Customer,{ID},z9-member-main",
        "{id} z9-member-main z9-role-customer",
    ])
    def test_converged_vm_tags_compare_as_normalised_set(self, fmt: str) -> None:
        sid = new_id("srv")
        tags = fmt.format(id=identity_tag(sid), ID=identity_tag(sid).upper())
        world = server_create.World(template=template(), vm=converged_vm(sid, tags=tags))
        assert server_create.plan(make_job("ServerCreate", sid, create_args()), world) == []

    def test_converged_vm_disk_size_in_mib(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(),
                                    vm=converged_vm(sid, scsi0="local-lvm:vm-101-disk-0,size=10240M"))
        assert server_create.plan(make_job("ServerCreate", sid, create_args()), world) == []

    def test_stopped_vm_just_starts(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(), vm=converged_vm(sid, status="stopped"))
        assert names(server_create.plan(make_job("ServerCreate", sid, create_args()), world)) == ["start"]

    def test_changed_config_and_small_disk(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(),
                                    vm=converged_vm(sid, cores=1, scsi0="local-lvm:vm-101-disk-0,size=2G"))
        assert names(server_create.plan(make_job("ServerCreate", sid, create_args()), world)) == [
            "configure", "resize_disk"]

    def test_missing_customer_role_needs_configure(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(), vm=converged_vm(sid, tags=identity_tag(sid)))
        assert names(server_create.plan(make_job("ServerCreate", sid, create_args()), world)) == ["configure"]

    def test_disk_larger_than_requested_is_permanent(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(),
                                    vm=converged_vm(sid, scsi0="local-lvm:vm-101-disk-0,size=20G"))
        with pytest.raises(PermanentError) as ei:
            server_create.plan(make_job("ServerCreate", sid, create_args(disk_gib=10)), world)
        assert "shrink" in str(ei.value)

    def test_vm_locked_by_backup_snoozes(self) -> None:
        sid = new_id("srv")
        world = server_create.World(template=template(), vm=converged_vm(sid, lock="backup", status="stopped"))
        with pytest.raises(Snooze) as ei:
            server_create.plan(make_job("ServerCreate", sid, create_args()), world)
        assert isinstance(ei.value, VmLocked)
        assert "backup" in str(ei.value)


class TestServerDeletePlan:
    def test_suspect_with_agent_role_is_refused(self) -> None:
        sid = new_id("srv")
        agent = vm(100, tags="z9-role-agent")
        with pytest.raises(GuardRefusal) as ei:
            server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[], suspects=[agent]))
        assert "z9-role-agent" in str(ei.value)

    def test_suspect_with_unknown_platform_role_is_refused(self) -> None:
        sid = new_id("srv")
        suspect = vm(100, tags="z9-role-dns;z9-role-customer")
        with pytest.raises(GuardRefusal):
            server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[], suspects=[suspect]))

    @pytest.mark.parametrize("tags", [None, "", "someone-else", f"z9-id-srv_{'0' * 26};z9-role-customer"])
    def test_suspect_not_ours_without_role_is_left_alone(self, tags: str | None) -> None:
        sid = new_id("srv")
        other = vm(100, tags=tags)
        assert server_delete.plan(make_job("ServerDelete", sid),
                                  server_delete.World(ours=[], suspects=[other])) == []

    def test_nothing_found_is_empty(self) -> None:
        sid = new_id("srv")
        assert server_delete.plan(make_job("ServerDelete", sid), server_delete.World()) == []

    def test_our_running_vm_is_stopped_then_destroyed(self) -> None:
        sid = new_id("srv")
        ours = vm(105, tags=format_tags(customer_vm_tags(sid)), status="running")
        steps = server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[ours]))
        assert names(steps) == ["stop", "destroy"]
        assert all(s.detail == {"vmid": 105, "node": NODE} for s in steps)

    def test_our_stopped_vm_is_destroyed(self) -> None:
        sid = new_id("srv")
        ours = vm(105, tags=format_tags(customer_vm_tags(sid)), status="stopped")
        assert names(server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[ours]))) == [
            "destroy"]

    def test_our_vm_without_customer_role_is_refused(self) -> None:
        sid = new_id("srv")
        ours = vm(105, tags=identity_tag(sid))
        with pytest.raises(GuardRefusal) as ei:
            server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[ours]))
        assert ROLE_CUSTOMER in str(ei.value)

    @pytest.mark.parametrize("role", [ROLE_PLATFORM, ROLE_AGENT])
    def test_our_vm_with_platform_role_is_refused(self, role: str) -> None:
        sid = new_id("srv")
        ours = vm(105, tags=f"{identity_tag(sid)};{ROLE_CUSTOMER};{role}")
        with pytest.raises(GuardRefusal) as ei:
            server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[ours]))
        assert role in str(ei.value)

    def test_one_refused_vm_refuses_the_whole_plan(self) -> None:
        sid = new_id("srv")
        good = vm(105, tags=format_tags(customer_vm_tags(sid)))
        bad = vm(106, tags=f"{identity_tag(sid)};{ROLE_CUSTOMER};{ROLE_PLATFORM}")
        with pytest.raises(GuardRefusal):
            server_delete.plan(make_job("ServerDelete", sid), server_delete.World(ours=[good, bad]))


class TestServerStopStartPlan:
    def test_stop_platform_vm_is_refused(self) -> None:
        sid = new_id("srv")
        for status in ("running", "stopped"):
            plat = vm(100, tags=f"{identity_tag(sid)};{ROLE_CUSTOMER};{ROLE_PLATFORM}", status=status)
            with pytest.raises(GuardRefusal):
                server_stop.plan(make_job("ServerStop", sid), server_stop.World(vm=plat))

    def test_stop_plans(self) -> None:
        sid = new_id("srv")
        tags = format_tags(customer_vm_tags(sid))
        job = make_job("ServerStop", sid)
        assert server_stop.plan(job, server_stop.World(vm=None)) == []
        assert server_stop.plan(job, server_stop.World(vm=vm(101, tags=tags, status="stopped"))) == []
        assert names(server_stop.plan(job, server_stop.World(vm=vm(101, tags=tags)))) == ["shutdown"]

    def test_start_platform_vm_is_refused_and_missing_vm_is_permanent(self) -> None:
        sid = new_id("srv")
        job = make_job("ServerStart", sid)
        with pytest.raises(GuardRefusal):
            server_start.plan(job, server_start.World(vm=vm(100, tags=f"{identity_tag(sid)};{ROLE_AGENT}",
                                                            status="stopped")))
        with pytest.raises(PermanentError):
            server_start.plan(job, server_start.World(vm=None))
        tags = format_tags(customer_vm_tags(sid))
        assert names(server_start.plan(job, server_start.World(vm=vm(101, tags=tags, status="stopped")))) == [
            "start"]
        assert server_start.plan(job, server_start.World(vm=vm(101, tags=tags))) == []


# ================================================================== proxmox adapter helpers

def _rex(status: int, message: str, content: str, errors: Any = None) -> ResourceException:
    return ResourceException(status, message, content, errors=errors)


class TestTranslate:
    def test_vm_locked(self) -> None:
        e = translate(_rex(500, "Internal Server Error", "VM is locked (clone)"), "configure VM 101")
        assert isinstance(e, VmLocked) and isinstance(e, Snooze)
        assert "configure VM 101" in str(e)

    def test_config_lock_timeout_is_temporary(self) -> None:
        e = translate(_rex(500, "Internal Server Error",
                           "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout"), "configure")
        assert isinstance(e, TemporaryError)
        assert not isinstance(e, (VmLocked, VmMissing, VmidTaken, PermanentError))

    def test_400_is_permanent(self) -> None:
        e = translate(_rex(400, "Parameter verification failed.", "Parameter verification failed.",
                           errors={"cores": "value must be at least 1"}), "configure")
        assert isinstance(e, PermanentError) and not isinstance(e, TemporaryError)
        assert "cores" in str(e)

    def test_501_is_permanent(self) -> None:
        assert isinstance(translate(_rex(501, "Not Implemented", "Method 'GET /x' not implemented"), "x"),
                          PermanentError)

    @pytest.mark.parametrize("status", [500, 502, 503, 504, 595, 596])
    def test_5xx_and_595_are_temporary(self, status: int) -> None:
        e = translate(_rex(status, "Errors during connection establishment", ""), "list VMs")
        assert isinstance(e, TemporaryError) and not isinstance(e, (PermanentError, Snooze))

    def test_auth_errors_are_temporary(self) -> None:
        e = translate(_rex(401, "Unauthorized", "authentication failure"), "list VMs")
        assert isinstance(e, TemporaryError)

    def test_connection_error_is_temporary(self) -> None:
        e = translate(requests.ConnectionError("connection reset by peer"), "list VMs")
        assert isinstance(e, TemporaryError) and not isinstance(e, PermanentError)
        assert isinstance(translate(requests.Timeout("read timed out"), "x"), TemporaryError)
        assert isinstance(translate(ConnectionResetError(), "x"), TemporaryError)

    def test_missing_config_is_vm_missing(self) -> None:
        e = translate(_rex(500, "Internal Server Error",
                           "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist"),
                      "read config of VM 100")
        assert isinstance(e, VmMissing) and isinstance(e, TemporaryError)

    def test_already_exists_is_vmid_taken(self) -> None:
        e = translate(_rex(500, "Internal Server Error", "unable to create VM 101: config file already exists"),
                      "clone")
        assert isinstance(e, VmidTaken)

    def test_unknown_exception_is_temporary(self) -> None:
        assert isinstance(translate(RuntimeError("boom"), "x"), TemporaryError)


class TestUpid:
    RAW = "UPID:pve1:000AB8DF:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:"

    def test_parse(self) -> None:
        u = Upid.parse(self.RAW)
        assert (u.raw, u.node, u.type, u.id, u.user) == (self.RAW, "pve1", "qmclone", "9000", "root@pam!z9")

    def test_parse_empty_id(self) -> None:
        u = Upid.parse("UPID:node-2:00001234:00ABCDEF:6B0C08F0:vzdump::root@pam:")
        assert u.node == "node-2" and u.type == "vzdump" and u.id == ""

    @pytest.mark.parametrize("junk", [
        "", "junk", "UPID:", "UPID:pve1", "UPID:pve1:000AB8DF:001034AE:6B0C08F0:qmclone:9000:root@pam!z9",
        "upid:pve1:000AB8DF:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:",
        "UPID:pve1:000ab8df:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:",
        "UPID:pve1:XYZ:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:",
        "UPID:pve 1:000AB8DF:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:",
        "UPID:pve1:000AB8DF:001034AE:6B0C08F0:qmclone:9000::",
        " UPID:pve1:000AB8DF:001034AE:6B0C08F0:qmclone:9000:root@pam!z9:",
    ])
    def test_rejects_junk(self, junk: str) -> None:
        with pytest.raises(PermanentError):
            Upid.parse(junk)

    def test_rejects_trailing_newline(self) -> None:
        with pytest.raises(PermanentError):
            Upid.parse(self.RAW + "\n")

    def test_rejects_none(self) -> None:
        with pytest.raises(PermanentError):
            Upid.parse(None)  # type: ignore[arg-type]


class TestEncodeSshKeys:
    def test_percent_encodes_spaces_newlines_and_slashes(self) -> None:
        key = "ssh-ed25519 AAAA/B+C= alice@example"
        out = encode_ssh_keys([key])
        assert " " not in out and "\n" not in out and "/" not in out and "+" not in out and "=" not in out
        assert "%20" in out and "%0A" in out and "%2F" in out
        assert out == "ssh-ed25519%20AAAA%2FB%2BC%3D%20alice%40example%0A"
        assert unquote(out) == key + "\n"

    def test_several_keys_joined_by_newlines(self) -> None:
        keys = ["ssh-ed25519 AAAA a@x", "ssh-rsa BBBB/== b@y"]
        out = encode_ssh_keys(keys)
        assert out.count("%0A") == 2
        assert unquote(out).splitlines() == keys


def test_task_failures_carry_their_class() -> None:
    from z9.common.errors import PermanentError, TemporaryError
    from z9.executor.proxmox import TaskFailed, TaskFailedPermanently, task_failure

    shrink = task_failure("UPID:pve1:00000001:00000002:6B000000:resize:101:root@pam!z9:", "resize",
                          "shrinking disks is not supported", ["TASK ERROR: shrinking disks is not supported"])
    assert isinstance(shrink, TaskFailedPermanently) and isinstance(shrink, PermanentError)
    assert not isinstance(shrink, TemporaryError) and shrink.error_class == "permanent"
    assert shrink.log_tail == ["TASK ERROR: shrinking disks is not supported"]
    other = task_failure("UPID:pve1:00000001:00000002:6B000000:qmstart:101:root@pam!z9:", "qmstart",
                         "start failed", [])
    assert isinstance(other, TaskFailed) and other.error_class == "temporary"


def test_only_a_missing_vm_config_is_vm_missing() -> None:
    from proxmoxer.core import ResourceException

    from z9.executor.proxmox import VmMissing, translate

    assert isinstance(translate(ResourceException(500, "x", "Configuration file 'nodes/pve1/qemu-server/100.conf' "
                                                            "does not exist"), "t"), VmMissing)
    assert not isinstance(translate(ResourceException(500, "x", "storage 'fast' does not exist"), "t"), VmMissing)


def test_settings_refuse_inconsistent_values() -> None:
    from pydantic import ValidationError

    from z9.common.settings import Settings

    with pytest.raises(ValidationError, match="HEARTBEAT"):
        Settings(lease_ttl_s=5, heartbeat_s=5)
    with pytest.raises(ValidationError):
        Settings(log_level="verbose")
    with pytest.raises(ValidationError):
        Settings(backoff_base_s=10, backoff_cap_s=1)


def test_every_named_query_starts_with_its_verb() -> None:
    """Leading comments in queries.sql are stripped: the text sent starts with the statement's
    verb (the asyncpg trace spans are named by it; a comment made them ``--``)."""
    from z9.common.sql import queries

    verbs = ("SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "SET")
    assert queries()
    for name, text in queries().items():
        assert text.split(None, 1)[0].upper() in verbs, (name, text[:60])
