"""One ComfyUI server: its command line (a pure function), its folders, its port, its log, its readiness.

What a real ComfyUI 0.3.64 showed (tests/recorded): its base directory must already hold
``custom_nodes/`` or it crashes at start; it keeps a SQLite database of its own outside the base
directory unless given ``--database-url``, so servers of one machine would share one file; and when its
port is taken it starts fully and only exits about 6 s later, so the port is checked before the launch
and the process holding it is named.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from comfysup import comfyversion
from comfysup.config import Config
from comfysup.gpus import Slot
from comfysup.models.cache import YAML_NAME, server_yaml
from comfysup.safefs import private_dirs
from comfysup.supervisor.notify import child_environment

LOG_NAME = "comfyui.log"


@dataclass(frozen=True)
class ServerPlan:
    """Everything needed to launch one slot's server, computed once from the config."""

    slot: Slot
    argv: tuple[str, ...]
    port: int
    url: str
    directory: Path
    log_path: Path
    model_paths: str = ""
    """The server's own extra_model_paths.yaml (the manifest's folders of links), written by ``prepare``; empty:
    the config has no [[models]]."""


def base_directory(config: Config, slot: Slot) -> Path:
    return (config.resolve(config.comfyui.base_directory) / slot.name).absolute()


def command_line(config: Config, slot: Slot) -> list[str]:
    """``<python> <main> --listen … --port … --cuda-device N|--cpu --base-directory … --database-url …``.

    Every slot gets its own ``--database-url`` in its own base directory: ComfyUI 0.38 keeps its assets
    database under a lock and a second server on the same database exits at start. Of ``extra_args`` only
    what the ComfyUI next to ``main`` accepts is passed (its comfyui_version.py says which it is); the flags
    it removed are dropped (see ``dropped_args``) instead of making every start exit 2."""
    c = config.comfyui
    directory = base_directory(config, slot)
    argv = [c.python or sys.executable, str(config.resolve(c.main).absolute()),
            "--listen", c.listen, "--port", str(c.base_port + slot.index)]
    argv += ["--cpu"] if slot.device is None else ["--cuda-device", str(slot.device)]
    argv += ["--base-directory", str(directory), "--database-url", f"sqlite:///{directory / 'comfyui.db'}"]
    if c.extra_model_paths_config:
        argv += ["--extra-model-paths-config", str(config.resolve(c.extra_model_paths_config).absolute())]
    if config.models:  # ComfyUI reads every file given (the flag appends), so the user's own one stays
        argv += ["--extra-model-paths-config", str(directory / YAML_NAME)]
    kept, _ = comfyversion.accepted_args(launched_version(config), list(c.extra_args))
    return argv + kept


def launched_version(config: Config) -> str | None:
    """The version of the ComfyUI ``[comfyui] main`` launches, read before the launch (None: unknown)."""
    return comfyversion.read_version_file(config.resolve(config.comfyui.main).absolute())


def dropped_args(config: Config) -> list[str]:
    """The ``extra_args`` the launched ComfyUI no longer accepts (the supervisor warns about them once)."""
    return comfyversion.accepted_args(launched_version(config), list(config.comfyui.extra_args))[1]


def url_for(config: Config, slot: Slot) -> str:
    host = config.comfyui.listen
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # listening everywhere; the supervisor talks to it on loopback
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.comfyui.base_port + slot.index}"


def plan(config: Config, slot: Slot) -> ServerPlan:
    directory = base_directory(config, slot)
    return ServerPlan(slot=slot, argv=tuple(command_line(config, slot)), port=config.comfyui.base_port + slot.index,
                      url=url_for(config, slot), directory=directory, log_path=directory / LOG_NAME,
                      model_paths=server_yaml(config) if config.models else "")


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """CUDA numbers devices as NVML does (PCI bus order), so ``--cuda-device N`` is NVML's GPU N."""
    env = child_environment(base)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.setdefault("PYTHONUNBUFFERED", "1")  # the log file shows what happened up to a crash
    return env


def prepare(p: ServerPlan) -> None:
    """Create the base directory and ``custom_nodes/`` (ComfyUI crashes at start without it), 0700 like the
    result store: the inputs and outputs of every job pass through it. A folder that exists is left as it is
    (its owner chose its mode). With a model manifest, write the server's extra_model_paths.yaml there."""
    private_dirs(p.directory / "custom_nodes")
    if p.model_paths:  # written at every start: the manifest or the base directory may have changed
        tmp = p.directory / f".{YAML_NAME}.tmp"
        tmp.write_text(p.model_paths)
        os.replace(tmp, p.directory / YAML_NAME)


def port_holder(host: str, port: int) -> str | None:
    """None when the port can be bound; else who holds it, as precisely as this user may see."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: TIME_WAIT is no holder
        try:
            sock.bind((host, port))
        except OSError:
            pass
        else:
            return None
    return f"port {port} is already in use by {_listener(port)}"


def _listener(port: int) -> str:
    """Who holds ``port``: the process listening there, else one whose connection's local end took it (a port
    in the range the OS hands out to outgoing connections, /proc/sys/net/ipv4/ip_local_port_range)."""
    conns: list[Any] = []
    with contextlib.suppress(psutil.Error, OSError):
        conns = [c for c in psutil.net_connections(kind="inet") if c.laddr and c.laddr.port == port and c.pid]
    for conn in sorted(conns, key=lambda c: c.status != psutil.CONN_LISTEN):
        try:
            cmd = " ".join(psutil.Process(conn.pid).cmdline())[:200]
        except psutil.Error:
            cmd = "?"
        if conn.status == psutil.CONN_LISTEN:
            return f"pid {conn.pid} ({cmd})"
        return (f"a connection of pid {conn.pid} ({cmd}), whose local end took it: choose a port outside the "
                "range the OS gives outgoing connections (/proc/sys/net/ipv4/ip_local_port_range)")
    return "another process, which this user cannot see (ss -tanp, run by its owner, names it)"


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MiB (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


def rotate_log(path: Path, max_bytes: int) -> bool:
    """Copy-truncate: the server keeps writing with O_APPEND into the same file, which restarts at 0.

    One older generation is kept as ``<name>.1``. Lines written between the copy and the truncation are
    lost; that is the price of not having to signal ComfyUI, which cannot reopen its output.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        with open(path, "r+b") as f:
            f.truncate(0)
    except OSError:
        return False
    return True


def log_tail(path: Path, lines: int = 5, max_bytes: int = 4096) -> str:
    """The last lines of a log, for a reason shown to people (why did it exit?)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
