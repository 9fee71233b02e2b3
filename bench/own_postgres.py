"""A PostgreSQL server of a benchmark's own: initdb in a temporary folder, its own port, stopped at the end.

A benchmark that wants the database's CPU alone (no other client's backends, no shared WAL writer working for
someone else's tests) or more connections than a shared server allows starts one:

    with own_postgres(max_connections=200) as (admin_url, postmaster):
        ...   # admin_url: postgresql://postgres@127.0.0.1:PORT/postgres; postmaster: its psutil.Process

Run as root, the server runs as the ``postgres`` user (initdb refuses root), so the folder is handed to it. The
binaries are the first ``initdb`` and ``pg_ctl`` on PATH, else the newest under /usr/lib/postgresql. The server
keeps PostgreSQL's durability defaults (fsync, synchronous_commit): a queue's commit costs what it costs in use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil


def binary(name: str) -> str:
    """The PostgreSQL program ``name``: on PATH, else in the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for folder in versions:
        if (folder / name).is_file():
            return str(folder / name)
    raise SystemExit(f"no {name} found (PATH, /usr/lib/postgresql/*/bin): install PostgreSQL's server package")


def as_postgres(command: list[str]) -> list[str]:
    """The command as the ``postgres`` user when this process is root (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def own_postgres(max_connections: int = 100, shared_buffers: str = "256MB") -> Iterator[tuple[str, psutil.Process]]:
    """A fresh server on 127.0.0.1 (trust authentication), its admin URL and its postmaster while the block runs."""
    folder = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    data, log = folder / "data", folder / "server.log"
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    port = free_port()
    try:
        subprocess.run(as_postgres([binary("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                                    "--no-sync"]), check=True, capture_output=True)
        options = (f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections={max_connections} "
                   f"-c shared_buffers={shared_buffers}")
        started = subprocess.run(as_postgres([binary("pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w",
                                              "start"]), capture_output=True, text=True)
        if started.returncode != 0:
            raise SystemExit(f"PostgreSQL did not start: {started.stderr}{log.read_text()[-2000:]}")
        postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(as_postgres([binary("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def server_processes(postmaster: psutil.Process) -> list[psutil.Process]:
    """Every process of the server: the postmaster, its backends and its shared processes (WAL writer, ...)."""
    try:
        return [postmaster, *postmaster.children(recursive=True)]
    except psutil.Error:
        return []
