"""z9.sim: a Proxmox VE 9 API simulator (TLS, token auth, schema validation, tasks, locks, faults, guests).

Entry points: :func:`z9.sim.server.start_simulator` (tests, ``z9 dev``), :func:`z9.sim.server.main`
(``z9 sim``), :class:`z9.sim.schema.PveSchema` (standalone request validation).

Modules:

- :mod:`z9.sim.server` — config (:class:`~z9.sim.server.SimConfig`), the dev seed, one HTTPS listener per node.
- :mod:`z9.sim.api` — the HTTP layer: PVE pipeline (auth → schema → faults → handler), the admin API ``/_sim``.
- :mod:`z9.sim.cluster` — VMs, tasks (UPIDs), config flocks and locks, clone/destroy/power, ``/cluster/resources``.
- :mod:`z9.sim.firewall` — VM firewall options and IP sets (keyed by vmid, copied by clone), cluster options.
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
"""
