"""z9: the job system of a small Proxmox VE cloud's control plane.

Packages: ``z9.common`` (libs/common), ``z9.db`` (db), ``z9.api``, ``z9.scheduler``,
``z9.executor``, ``z9.reaper`` (services/*), ``z9.sim`` (simulator: a Proxmox VE simulator).
The ``z9`` command is :func:`z9.cli.main`.
"""
