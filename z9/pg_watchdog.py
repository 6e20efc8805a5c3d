"""``python -m z9.pg_watchdog PGDATA LOCKFILE``: stops ``z9 dev``'s embedded PostgreSQL when
``z9 dev`` dies, however it dies (SIGKILL, the OOM killer).

``pg_ctl`` daemonizes the postmaster, so no parent-death signal (``PR_SET_PDEATHSIG``) reaches it,
and ``z9 dev``'s own shutdown does not run when it is killed. This small process does: ``z9 dev``
starts it with a pipe on its stdin and keeps the other end, which the kernel closes when ``z9
dev`` ends. At end of file the watchdog asks the postmaster named in ``PGDATA/postmaster.pid`` for
a fast shutdown (SIGINT: PostgreSQL's "fast" mode, as ``pg_ctl stop -m fast``), waits for it to go
(60 s, then SIGQUIT: immediate), and exits. After a clean ``z9 dev`` stop the server is already
gone and it just exits.

It holds ``LOCKFILE`` (``flock``) while it lives, so the next ``z9 dev`` on the data directory waits
for a server being stopped to be gone before starting one (:func:`wait_previous`), rather than
attaching to a server about to stop. Standard library only: it must start fast and outlive the
interpreter that started it (its own session: a Ctrl-C in ``z9 dev``'s terminal is not for it).
"""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import sys
import time
from pathlib import Path


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the postmaster running on ``pgdata`` (None: none, or a stale file)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"postgres" in cmdline else None  # a reused pid is not ours


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is gone for our purpose (its parent, init, reaps it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_postmaster(pgdata: Path, *, fast_s: float = 60.0) -> int | None:
    """Stop the postmaster on ``pgdata``: SIGINT (fast shutdown), SIGQUIT after ``fast_s``. Returns
    the pid it stopped (None: nothing ran)."""
    pid = postmaster_pid(pgdata)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return pid
    deadline = time.monotonic() + fast_s
    while _alive(pid):
        if time.monotonic() >= deadline:
            try:
                os.kill(pid, signal.SIGQUIT)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + fast_s
        time.sleep(0.1)
    return pid


def wait_previous(lockfile: Path, timeout_s: float = 90.0) -> bool:
    """Wait until no watchdog holds ``lockfile`` (a previous ``z9 dev``'s, still stopping its
    server); False after ``timeout_s``."""
    fd = os.open(lockfile, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
    finally:
        os.close(fd)  # releases the lock too


def main(argv: list[str]) -> int:
    pgdata, lockfile = Path(argv[0]), Path(argv[1])
    fd = os.open(lockfile, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process ends
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end stops it
    try:
        sys.stdout.write("watching\n")
        sys.stdout.flush()
    except OSError:
        pass
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    stop_postmaster(pgdata)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
