"""``comfysup health``: a readiness probe — exit 0 when at least one ComfyUI server is healthy, else 1.

It asks each server directly (``/system_stats`` for the device and free VRAM, ``/queue`` for its
length) rather than trusting the supervisor alone, and takes the slots from the supervisor's state
file, plus the [[servers]] of the config. A launched slot counts only while the supervisor runs and
says it is running: a server without its supervisor has no runner and does no work.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from comfysup.comfy import ComfyClient, ComfyError
from comfysup.commands._common import config_from
from comfysup.slotstate import read_state, read_work_state, staleness


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("health", parents=[common], help="exit 0 when at least one ComfyUI server is healthy",
                       description="Show each server's state, device, free VRAM and queue length, asking each "
                                   "server directly. Exit 0 when at least one is healthy, 1 otherwise: a "
                                   "readiness probe for a load balancer or a monitoring check.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--timeout-seconds", type=float, default=2.0, help="per request (default 2)")
    p.set_defaults(func=run)


@dataclass
class Health:
    name: str
    url: str
    state: str
    device: str = "-"
    comfyui_version: str = "-"
    vram_free_mb: int | None = None
    queue_length: int | None = None
    healthy: bool = False
    problem: str = ""


def probe(name: str, url: str, state: str, timeout_seconds: float) -> Health:
    """Ask one server; ``state`` is what the supervisor says of it (``external`` for [[servers]])."""
    h = Health(name=name, url=url, state=state)
    client = ComfyClient(url, timeout_seconds=timeout_seconds)
    try:
        stats = client.system_stats(timeout_seconds)
        devices = stats.get("devices") or [{}]
        h.device = str(devices[0].get("name") or "-")
        h.comfyui_version = str(stats.get("system", {}).get("comfyui_version") or "-")
        free = devices[0].get("vram_free")
        h.vram_free_mb = int(free) // 2**20 if isinstance(free, int | float) else None
        h.queue_length = len(client.queue())
    except ComfyError as exc:
        h.problem = exc.reason
    except (ValueError, AttributeError, IndexError, TypeError) as exc:
        h.problem = f"unexpected /system_stats answer: {exc}"
    finally:
        client.close()
    if not h.problem and state not in ("running", "external"):
        h.problem = state if state.startswith("out of service") else f"the supervisor says {state}"
    h.healthy = not h.problem
    return h


def targets(config: Any, state: dict[str, Any] | None, now: float,
            work: dict[str, Any] | None = None) -> tuple[list[tuple[str, str, str]], str]:
    """(name, url, state) for every server to ask, and a note on the supervisor."""
    found: dict[str, tuple[str, str, str]] = {}
    note = "supervisor: no state file (comfysup run has not run with this queue)"
    if state is not None:
        stale = staleness(state, now)
        note = f"supervisor pid {state.get('pid')}: running" if stale is None else f"supervisor: {stale}"
        for slot in state["slots"]:
            slot_state = str(slot.get("state")) if stale is None else "stale"
            found[str(slot.get("name"))] = (str(slot.get("name")), str(slot.get("url")), slot_state)
    for remote in config.servers:
        found.setdefault(remote.name, (remote.name, remote.url, "external"))
    if work is not None and staleness(work, now) is None:
        # comfysup work's servers: one whose prompt is stuck after /interrupt is out of service.
        for slot in work["slots"]:
            name, reason = str(slot.get("name")), slot.get("out_of_service")
            if reason or name not in found:
                found[name] = (name, str(slot.get("url")), str(reason) if reason else "external")
    return list(found.values()), note


def render(results: list[Health], note: str) -> str:
    lines = [note, f"{'server':10} {'state':10} {'comfyui':8} {'device':24} {'free VRAM':>10} {'queue':>5}  health"]
    for h in results:
        vram = "-" if h.vram_free_mb is None else f"{h.vram_free_mb} MiB"
        queue = "-" if h.queue_length is None else str(h.queue_length)
        verdict = "ok" if h.healthy else f"unhealthy: {h.problem}"
        lines.append(f"{h.name:10} {h.state[:10]:10} {h.comfyui_version[:8]:8} {h.device[:24]:24} {vram:>10} "
                     f"{queue:>5}  {verdict}")
    healthy = sum(h.healthy for h in results)
    lines.append(f"{healthy} of {len(results)} server(s) healthy")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    now = time.time()
    servers, note = targets(config, read_state(config), now, read_work_state(config))
    results = [probe(name, url, state, args.timeout_seconds) for name, url, state in servers]
    if args.json:
        print(json.dumps({"note": note, "servers": [asdict(h) for h in results],
                          "healthy": sum(h.healthy for h in results)}, indent=2))
    else:
        print(render(results, note) if results else f"{note}\nno server to ask: start comfysup run, or list "
                                                    "[[servers]] in the config")
    return 0 if any(h.healthy for h in results) else 1
