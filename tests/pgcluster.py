"""Test-owned PostgreSQL clusters and PgBouncer from Debian's binaries, on free ports in a temp
folder (never the machine's cluster on 5432): a primary with a synchronous standby
(``initdb``, ``pg_basebackup -R``, ``synchronous_standby_names``), SIGKILL, promotion; and a
PgBouncer in front of any server. Run as root, every server runs as the ``postgres`` system
user (Debian's package creates it), the way PostgreSQL requires. Used by ``tests/acceptance/test_ha.py``,
``tests/acceptance/test_pgbouncer.py`` and ``bench/failover.py``, ``bench/pgbouncer_drain.py``.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.support import poll_sync


def pg_bindir() -> Path | None:
    """Debian's newest PostgreSQL ``bin`` folder (``/usr/lib/postgresql/<v>/bin``), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


from tests.ports import free_port  # noqa: E402,F401


def _run_as(user: str = "postgres") -> list[str]:
    """Command prefix running a server binary as a non-root user (PostgreSQL and PgBouncer
    refuse root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", user, "--"]


def _chown(path: Path, user: str = "postgres") -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        for p in [path, *path.rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)


def make_workdir(prefix: str, user: str = "postgres") -> Path:
    """A fresh folder under the temp root that the server user owns (pytest's own temp folders
    are 0700 root and pytest resets that mode, so servers get their own). Remove it with
    :func:`remove_workdir`."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix))
    _chown(d, user)
    return d


def remove_workdir(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)


class PgServer:
    """One PostgreSQL server (its own data folder and port, socket in its folder)."""

    def __init__(self, bindir: Path, datadir: Path, port: int, name: str):
        self.bindir, self.datadir, self.port, self.name = bindir, datadir, port, name
        self.log = datadir.parent / f"{name}.log"

    def _cmd(self, tool: str, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([*_run_as(), str(self.bindir / tool), *args], timeout=timeout,
                             capture_output=True, text=True)
        if check and out.returncode:
            raise RuntimeError(f"{tool} {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
        return out

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def initdb(self, **conf: str) -> "PgServer":
        self._cmd("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C.UTF-8")
        self.conf(listen_addresses="'127.0.0.1'", port=str(self.port),
                  unix_socket_directories=f"'{self.datadir.parent}'", wal_level="replica",
                  max_wal_senders="5", fsync="off", full_page_writes="on", **conf)
        with open(self.datadir / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        return self

    def conf(self, **conf: str) -> None:
        """Append settings to ``postgresql.conf`` (the last line wins)."""
        with open(self.datadir / "postgresql.conf", "a") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")

    def basebackup_from(self, primary: "PgServer") -> "PgServer":
        """A streaming standby of ``primary`` (``pg_basebackup -R``: standby.signal + conninfo
        naming this standby ``application_name=<name>``)."""
        self._cmd("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                  "-D", str(self.datadir), "-R", "-X", "stream", "-c", "fast",
                  "-d", f"application_name={self.name}")
        os.chmod(self.datadir, 0o700)
        # It runs alone once promoted: its commits must not wait for a standby it does not have.
        self.conf(port=str(self.port), synchronous_standby_names="''")
        return self

    def start(self) -> "PgServer":
        self._cmd("pg_ctl", "-D", str(self.datadir), "-l", str(self.log), "-w", "-t", "60", "start")
        return self

    def start_again(self, timeout_s: float = 60) -> PgServer:
        """:meth:`start` after :meth:`kill`, tried until the port is bound: the sockets of the killed
        server's connections may hold it for a moment ("could not bind … Address already in use")."""
        def started() -> bool:
            try:
                self.start()
            except RuntimeError as e:
                if "could not start server" not in str(e):
                    raise
                return False
            return True
        poll_sync(started, timeout_s, f"{self.name} to start again", interval_s=0.5)
        return self

    def stop(self) -> None:
        if (self.datadir / "postmaster.pid").exists():
            self._cmd("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop", check=False)

    def pids(self) -> list[int]:
        """The postmaster and every backend of this server."""
        pidfile = self.datadir / "postmaster.pid"
        if not pidfile.exists():
            return []
        master = int(pidfile.read_text().split()[0])
        out = [master]
        kids = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        return out + [int(k) for k in kids]

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once: the machine is gone (clients get
        their connections reset; nothing is flushed or handed over). Returns once every one of
        them is gone (its port free again: :meth:`start` may follow at once)."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        def gone() -> bool:
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if f.read().rpartition(")")[2].split()[0] != "Z":  # a zombie holds no socket
                            return False
                except FileNotFoundError:
                    continue
            return True
        poll_sync(gone, 30, f"the processes of {self.name} to end")

    def promote(self) -> None:
        self._cmd("pg_ctl", "-D", str(self.datadir), "-w", "-t", "60", "promote")


def primary_and_standby(bindir: Path | None = None) -> tuple[PgServer, PgServer]:
    """A started primary whose commits wait for the started standby (``synchronous_commit=on``,
    ``synchronous_standby_names='*'``), in a fresh folder (``primary.datadir.parent``: remove it
    with :func:`remove_workdir` after stopping both)."""
    bindir = bindir or pg_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql")
    workdir = make_workdir("z9-ha-")
    primary = PgServer(bindir, workdir / "primary", free_port(), "primary").initdb(
        synchronous_standby_names="'*'", synchronous_commit="on")
    primary.start()
    standby = PgServer(bindir, workdir / "standby", free_port(), "standby").basebackup_from(primary)
    standby.start()
    return primary, standby


def wait_sync_standby(primary: PgServer, timeout_s: float = 30) -> None:
    """Until the primary reports a standby in ``sync`` state."""
    def synchronous() -> bool:
        out = subprocess.run([*_run_as(), str(primary.bindir / "psql"), "-h", "127.0.0.1", "-p", str(primary.port),
                              "-U", "postgres", "-Atc", "SELECT sync_state FROM pg_stat_replication"],
                             capture_output=True, text=True).stdout.split()
        return "sync" in out
    poll_sync(synchronous, timeout_s, "the standby to become synchronous", interval_s=0.2)


class PgBouncer:
    """Debian's PgBouncer (``/usr/sbin/pgbouncer``) in front of one server: one database entry
    ``<alias>`` → ``dbname`` on ``host:port`` (``host`` may be a Unix socket folder),
    ``auth_type=trust``. Run as root, it runs as ``user`` (by default ``postgres``, or the owner
    of the socket folder it must reach)."""

    def __init__(self, *, host: str, port: int, dbname: str, alias: str = "z9",
                 pool_mode: str = "transaction", default_pool_size: int = 4, extra: str = ""):
        self.user = "postgres"
        if host.startswith("/") and os.geteuid() == 0:
            owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
            self.user = owner if owner != "root" else "postgres"
        self.workdir = workdir = make_workdir("z9-pgbouncer-", self.user)
        self.port = free_port()
        self.alias = alias
        self.ini = workdir / "pgbouncer.ini"
        (workdir / "userlist.txt").write_text('"postgres" ""\n')
        self.ini.write_text(f"""[databases]
{alias} = host={host} port={port} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / 'userlist.txt'}
pool_mode = {pool_mode}
default_pool_size = {default_pool_size}
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {workdir / 'pgbouncer.log'}
pidfile = {workdir / 'pgbouncer.pid'}
{extra}
""")
        _chown(workdir, self.user)
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)

    def url(self, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{self.alias}"

    def start(self) -> "PgBouncer":
        exe = self.binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.proc = subprocess.Popen([*_run_as(self.user), exe, str(self.ini)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        def listening() -> bool:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return True
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            return False
        poll_sync(listening, 20, f"pgbouncer to listen on {self.port}")
        return self

    def admin(self, command: str) -> list[dict[str, str]]:
        """Rows of an admin console command (``SHOW SERVERS``) through ``psql --csv`` (the console
        speaks the simple query protocol only; needs ``admin_users = postgres``)."""
        import csv
        import io

        psql = shutil.which("psql") or str((pg_bindir() or Path("/usr/bin")) / "psql")
        out = subprocess.run([psql, "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "--csv",
                              "-c", command, "pgbouncer"], capture_output=True, text=True, check=True, timeout=30)
        return list(csv.DictReader(io.StringIO(out.stdout)))

    def log(self) -> str:
        p = self.workdir / "pgbouncer.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_workdir(self.workdir)
