"""A PostgreSQL server of the test's own, to stop, kill and start again under running jobs (the machine's shared
one at 5432 is never touched).

``initdb`` runs as the ``postgres`` user (the server refuses root) in a temporary folder that user owns (pytest's
tmp_path is the test user's alone), removed at the end; the server listens on 127.0.0.1 at a port outside the
ephemeral range (tests/port_support.py), the same one across restarts, with trust authentication. Without
PostgreSQL's binaries, or the user, the tests that need it are skipped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from port_support import server_port

START_SECONDS = 30.0


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class OwnPostgres:
    """One PostgreSQL server in a temporary folder: ``url``, ``start``, ``stop`` (a fast shutdown), ``kill``
    (SIGKILL of the postmaster: its backends end as their socket does), ``up`` (whether it answers)."""

    def __init__(self) -> None:
        bindir = _bin()
        if bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("no PostgreSQL binaries (or not root, to run them as the postgres user)")
        self.bin = bindir
        self.root = Path(tempfile.mkdtemp(prefix="comfysup-pg-"))
        shutil.chown(self.root, "postgres")
        self.data = self.root / "data"
        self.port = server_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = self.admin_url
        self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        settings = (f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                    "fsync = off\nfull_page_writes = off\nsynchronous_commit = on\nshared_buffers = 16MB\n"
                    "max_connections = 60\n")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(settings)

    def _as_postgres(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=START_SECONDS)

    def start(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t",
                          str(int(START_SECONDS)), "start")

    def stop(self) -> None:
        """A fast shutdown: every session is ended, what was committed is kept."""
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def kill(self) -> None:
        """SIGKILL of the postmaster and its backends, as a crash; the next start recovers from the WAL."""
        pid = self.pid()
        if pid is None:
            return
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for one in (pid, *map(int, children)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(one, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.up_process(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        for lock in (self.data / "postmaster.pid", self.root / f".s.PGSQL.{self.port}.lock"):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()  # a dead postmaster's: what a crashed machine's reboot leaves behind

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and self.up_process(pid)

    def fresh_database(self) -> None:
        """An empty database of its own on this server; ``url`` names it from now on."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def up_process(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def module_postgres() -> Iterator[OwnPostgres]:
    """One PostgreSQL for a test module's tests (initdb costs a second or two), removed after them."""
    server = OwnPostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def own_postgres(module_postgres: OwnPostgres) -> OwnPostgres:
    """The module's PostgreSQL, running (a test before may have left it stopped), ``url`` naming a database of this
    test's own. Import both fixtures by name: ``from tests.pg_server import module_postgres, own_postgres``."""
    server = module_postgres
    if not server.running():
        server.start()
    server.fresh_database()
    return server
