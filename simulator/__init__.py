"""z9.sim: a Proxmox VE 9 API simulator (TLS, token auth, schema validation, tasks, locks, faults).

Entry points: :func:`z9.sim.server.start_simulator` (tests, ``z9 dev``), :func:`z9.sim.server.main`
(``z9 sim``), :class:`z9.sim.schema.PveSchema` (standalone request validation).
"""
