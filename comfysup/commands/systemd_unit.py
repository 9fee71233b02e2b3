"""``comfysup systemd-unit``: print a unit file for this installation, to install as a service.

Type=notify because the supervisor says READY once its servers answer, and pings the watchdog from
its main loop. KillMode=mixed: systemd sends SIGTERM to the supervisor alone, which stops its runners
and servers in order (a SIGTERM to every process at once would interrupt jobs without the grace), and
SIGKILLs whatever is left after TimeoutStopSec. The hardening leaves /dev alone (no PrivateDevices,
no DevicePolicy) because ComfyUI needs /dev/nvidia*.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from comfysup.commands._common import config_from
from comfysup.config import Config, check_supervisor, find_config_file
from comfysup.errors import UsageError
from comfysup.models.cache import cache_dir
from comfysup.supervisor.supervisor import KILL_WAIT_SECONDS, RUNNER_STOP_MARGIN_SECONDS

WATCHDOG_SECONDS = 60
STOP_MARGIN_SECONDS = 30


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("systemd-unit", parents=[common], help="print a systemd unit that runs comfysup run",
                       description="Print a systemd service unit for this installation: the absolute paths of "
                                   "this comfysup and of the config, Type=notify, graceful stop, restart on "
                                   "failure, watchdog, a dedicated user, and hardening that leaves GPUs visible. "
                                   "Save it as /etc/systemd/system/comfysup.service.")
    p.add_argument("--user", default="comfysup", help="the user the service runs as (default: comfysup)")
    p.add_argument("--group", help="its group (default: the user's own)")
    p.set_defaults(func=run)


def executable() -> list[str]:
    """How to start this very comfysup: its script next to this Python, else this Python with -m."""
    beside = Path(sys.executable).parent / "comfysup"
    if beside.is_file():
        return [str(beside.absolute())]
    found = shutil.which("comfysup")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "comfysup"]


PRIVATE_TMP = ("/tmp", "/var/tmp")
"""What PrivateTmp=yes replaces by an empty folder of the service's own."""


def in_private_tmp(config: Config, config_path: Path) -> list[str]:
    """The installation's paths that PrivateTmp=yes would hide from the service (an installation tried out under
    /tmp): comfysup itself, the config, ComfyUI, its Python, and every folder the service writes."""
    paths = [executable()[0], str(config_path), str(config.resolve(config.comfyui.main)),
             *([config.comfyui.python] if config.comfyui.python else []),
             str(config.resolve(config.queue.path)), str(config.resolve(config.store.dir)),
             str(config.resolve(config.comfyui.base_directory))]
    hidden = []
    for path in paths:
        absolute = str(Path(path).absolute())
        if any(absolute == t or absolute.startswith(t + "/") for t in PRIVATE_TMP) and absolute not in hidden:
            hidden.append(absolute)
    return hidden


def unit(config: Config, config_path: Path, user: str, group: str | None = None) -> str:
    """The unit text. Every path is absolute: systemd resolves nothing against a working directory. PrivateTmp is
    left out (and says why) when the installation lives under /tmp, which it would hide from the service."""
    hidden = in_private_tmp(config, config_path)
    writable = sorted({str(config.resolve(config.queue.path).parent.absolute()),
                       str(config.resolve(config.store.dir).absolute()),
                       str(config.resolve(config.comfyui.base_directory).absolute()),
                       *([str(cache_dir(config))] if config.models else [])})
    stop_seconds = int(config.runner.grace_seconds) + STOP_MARGIN_SECONDS
    assert stop_seconds > config.runner.grace_seconds + RUNNER_STOP_MARGIN_SECONDS + KILL_WAIT_SECONDS
    exec_start = shlex.join([*executable(), "run", "--config", str(config_path)])
    lines = [
        "# comfysup: one ComfyUI server per GPU and a runner for each, supervised.",
        "# Written by `comfysup systemd-unit`. Install, as root:",
        "#   cp comfysup.service /etc/systemd/system/ && systemctl daemon-reload",
        "#   systemctl enable --now comfysup",
        "[Unit]",
        "Description=comfysup: ComfyUI servers and job runners",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        f"ExecStart={exec_start}",
        f"WorkingDirectory={config_path.parent}",
        f"User={user}",
        f"Group={group or user}",
        "# SIGTERM to the supervisor only: it gives running jobs their grace, then stops its servers.",
        "KillMode=mixed",
        f"TimeoutStopSec={stop_seconds}",
        f"TimeoutStartSec={int(config.comfyui.startup_seconds) + STOP_MARGIN_SECONDS}",
        "Restart=on-failure",
        "RestartSec=5",
        f"WatchdogSec={WATCHDOG_SECONDS}",
        "# Hardening that leaves the GPUs visible to ComfyUI: no PrivateDevices, no DevicePolicy.",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        *(["# No PrivateTmp: it would hide this installation, which lives under /tmp (" + ", ".join(hidden[:3])
            + "); move it to /opt or /srv to get it back."] if hidden else ["PrivateTmp=yes"]),
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "# The queue, the result store and the servers' base directories (and the model cache of a manifest): create "
        "them, owned by the user.",
        f"ReadWritePaths={' '.join(writable)}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    path = find_config_file(args.config)
    if path is None:
        raise UsageError("no config file: give --config PATH (the service needs one; comfysup init writes one)")
    config = config_from(args, required=False)
    check_supervisor(config)
    hidden = in_private_tmp(config, path.absolute())
    if hidden:
        print(f"note: this installation lives under /tmp ({', '.join(hidden[:3])}); PrivateTmp=yes would hide it "
              "from the service, so the unit goes without it. A service is better installed under /opt or /srv "
              "(and /tmp may be emptied at boot).", file=sys.stderr)
    sys.stdout.write(unit(config, path.absolute(), args.user, args.group))
    return 0
