"""z9.sim: a Proxmox VE 9 API simulator (TLS, token auth, schema validation, tasks, locks, faults, guests).

Entry points: :func:`z9.sim.server.start_simulator` (tests, ``z9 dev``), :func:`z9.sim.server.main`
(``z9 sim``), :class:`z9.sim.schema.PveSchema` (standalone request validation).

Modules:

- :mod:`z9.sim.server` — config (:class:`~z9.sim.server.SimConfig`), the dev seed, one HTTPS listener per node.
- :mod:`z9.sim.api` — the HTTP layer: PVE pipeline (auth → schema → faults → handler), the admin API ``/_sim``.
- :mod:`z9.sim.cluster` — VMs, tasks (UPIDs), config flocks and locks, clone/destroy/power, ``/cluster/resources``.
- :mod:`z9.sim.firewall` — VM firewall options, IP sets and rules (keyed by vmid, copied by clone), cluster
  options, and what pve-firewall enforces from them every 10 s: ``deliver`` (``GET /_sim/firewall/deliver``)
  answers whether a packet from X to guest Y would be delivered; the guest models ask it.
  :mod:`z9.sim.firewall_formats` — the rule parameters' names, numbers and schema formats.
- :mod:`z9.sim.cloudinit` — PVE's own cloud-init drive: generation, pending keys, dump, when it is regenerated.
- :mod:`z9.sim.storage` — storages, ISO uploads (``imgcopy``), node-local vs shared, deletion.
- :mod:`z9.sim.guest` — **the guest model**: boot, cloud-init from the CD-ROM bytes, instance-id, network,
  the QEMU guest agent, per-VM files, and the **command-handler registry** later models (HAProxy, kubeadm,
  kubectl) plug into: ``@z9.sim.guest.command("haproxy")`` — read that module's docstring first.
- :mod:`z9.sim.appliance` — the load balancer appliance on the guest model: ``haproxy -c`` and
  ``keepalived -t`` run Debian's real binaries (keepalived in a namespace with the guest's NICs),
  ``systemctl reload``, ``show stat`` computed from the world, keepalived's VIP.
- :mod:`z9.sim.faults` — request faults (error, delay, drop, fail_task, abort/corrupt uploads).
- :mod:`z9.sim.schema` — validation against the real PVE 9.1.3 schema.
- :mod:`z9.sim.permissions` — API tokens, privilege separation, ACLs, each method's schema ``permissions``.

Fidelity: what is modelled after PVE's source, and what is not (and why)
-------------------------------------------------------------------------
Modelled (each behaviour cites its qemu-server / pve-guest-common / pve-manager source beside it):

- placement: a clone with ``target=`` another node of a VM with any volume on non-shared storage is
  refused before fork_worker (``can't clone VM to node '…' (VM uses local storage)``, Qemu.pm
  clone_vm); a target clone's ``lock: clone`` config lives on the source node until the task ends;
  the clone's ``storage`` is honoured; ``POST …/migrate`` (offline with local disks, ``lock: migrate``);
- locks: PUT/POST config check digest and ``check_lock`` before the flock (``VM is locked (clone)`` at
  once); ``skiplock`` is root@pam's only (a token is refused: config writes, destroy); the racy newid
  check of clone (two clones to one newid sent before either worker wrote the temporary config both
  get a UPID, the second task fails; admin ``clone_race: n`` makes the next n lose deterministically);
  template refused before the task for a VM with snapshots; a second cloud-init drive refused;
  ``migrate``'s ``targetstorage`` checked before the task;
- power: reboot/reset of a stopped VM answer 500 ``VM n not running`` before any task; a reboot is a
  stop task, then qmeventd's own ``qmstart``; suspend/resume (``qmpstatus: paused``); template;
  snapshots (list with ``current``, create under ``lock: snapshot``, delete relinking parents, rollback);
- config: ``[PENDING]`` on a running VM for what is not hot-pluggable (QemuServer.pm
  vmconfig_hotplug_pending: cores never, memory only with the memory feature, ``agent`` never, a disk's
  ``cache``/``aio``/``discard``/… never — vmconfig_update_disk), GET config with pending
  laid over (``current=1`` without), ``/pending``, applied at start; ``STORAGE:SIZE`` allocation;
  ``unusedN`` for a detached disk; a MAC for a NIC without one; ``cipassword`` stored as crypt ``$5$``
  and read ``**********``; empty writes and ``delete=`` of unknown options refused;
- permissions: a token of root@pam or of another user (``POST /_sim/tokens`` with the user's ACL,
  ``user_acl``) holds its user's privileges, intersected with its own ACL when privilege-separated
  (RPCEnvironment.pm ``permissions``; the deepest ACL path replaces inherited ones); a missing one is
  403 ``Permission check failed (<path>, <privilege>)`` (the first missing; ``check_any``: all,
  ``|``-joined); besides the schema's ``check``, qemu-server's checks in code where z9 goes: each
  config key by its class, drives (CDROM/Disk), bridges (SDN.Use), the clone's storages, the resize's
  storage, a volume delete's ``Datastore.Allocate``; ``/cluster/resources`` lists only audited VMs;
  ``/access/permissions`` lists the privileges;
- validation: property strings are parsed as pve-common JSONSchema.pm parse_property_string does
  against the schema's hash formats (``memory``, ``netN`` model and MAC, drive options: unknown keys,
  aliases, default keys, sub-value types, enums, formats), a ``boot`` order naming a missing device is
  refused, a start on a bridge other than ``vmbr0`` fails as QEMU's pve-bridge does;
- HTTP: PVE's 501 text for unknown routes, 401 without a body and after pveproxy's delay
  (``auth_delay_s``, 3 s as AnyEvent.pm's "always delay unauthorized calls by 3 seconds"; the tests
  pass 0), ``total`` in task-log and task-list envelopes, the task list's filters, the schema's Perl
  ``(?^:…)`` patterns;
- JSON types as Perl's encoder writes them: ``nextid`` a string, config values as check_type leaves
  them (integer/boolean options numbers, ``number`` options and property strings strings), counters
  of status, resources, storages and tasks numbers;
- firewall (pve-firewall ``Firewall.pm``, ``API2/Firewall/Rules.pm``, ``Service/pve_firewall.pm``): the
  VM rules API (insert first, disabled unless enabled, digest, moveto, ``verify_rule``'s errors), the
  compiled chains (cluster/VM/NIC switches, policies, rules in order, ports, protocols, addresses,
  IP sets, the IP filter, DHCP), the daemon's 10 s cycle on a clock tests step, conntrack where it
  decides (replies; unicast VRRP's two directions); security groups, aliases, cluster IP sets, most
  macros and ICMP types other than echo-request are not modelled;
- storage: a shared images storage ``ceph-vm`` (rbd) beside node-local ``local-lvm``: a template on it
  is cloned with ``target=`` another node directly (storage.py); the content listing has templates'
  ``base-…`` volumes and linked clones as each plugin names them (rbd ``<base>/vm-…`` with its
  ``parent``, lvmthin a plain ``vm-…``).

Not modelled (z9 does not go there, or the model would be guesswork):

- tickets of users other than root@pam, groups, named roles (an ACL entry carries its privileges),
  pools, ``user-tag-access`` other than ``free``, privileged tags, and the check kinds
  ``userid-group``/``userid-param``/``perm-modify`` (allowed): the model (:mod:`z9.sim.permissions`)
  is API tokens with or without privilege separation, their users' ACLs and their own;
- backups, HA resources, replication, SDN, containers (``lxc``), RAM in snapshots (``vmstate``), live
  migration's memory copy (a running VM's migration is accepted only with ``online`` and moves at
  once), suspend to disk;
- named formats other than the simulator's (``_FORMATS`` in schema.py: storage ids, tags, vmids, nodes,
  DNS names, config ids, IPs/CIDRs, MACs, ipconfig) are accepted as sent;
- CPU, memory and disk usage figures (fixed or derived from the config), node load, RRD data.
"""
