"""The per-slot gauges of the supervisor's state file (comfysup.slotstate): each slot's server and runner,
its readiness and its memory recoveries, labelled by slot and device; and the bound every label value keeps.

Where the supervisor is not running (its state is stale) the gauges that say a slot does something now read 0;
counts since the supervisor started stay as it last wrote them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from comfysup.runner.memory import COUNTS

LABEL_CHARS = 64
Slot = dict[str, Any]
Value = Callable[[Slot, bool], float]


def label(value: str | None, default: str = "none") -> str:
    """A label value: bounded, printable, never empty."""
    text = "".join(c if c.isprintable() else "?" for c in (value or default))[:LABEL_CHARS]
    return text or default


def _count(key: str) -> Value:
    """A count the state file keeps for the slot (absent: 0)."""
    return lambda slot, running: float(slot.get(key) or 0)


def _now(test: Callable[[Slot], Any]) -> Value:
    """1 while the supervisor runs and ``test`` holds for the slot, else 0."""
    return lambda slot, running: 1.0 if running and test(slot) else 0.0


def _serving(slot: Slot) -> bool:
    return slot.get("state") in ("running", "external") and not slot.get("out_of_service")


SLOT_GAUGES: tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, Value], ...] = (
    (GaugeMetricFamily, "comfysup_slot_up", "1 while the slot's ComfyUI server runs (or an external one is used) and "
     "its supervisor is alive.", _now(_serving)),
    (GaugeMetricFamily, "comfysup_slot_restarts", "Restarts of the slot's ComfyUI server since the supervisor "
     "started.", _count("restarts")),
    (GaugeMetricFamily, "comfysup_slot_runner_restarts", "Restarts of the slot's runner since the supervisor "
     "started.", _count("runner_restarts")),
    (GaugeMetricFamily, "comfysup_slot_busy", "1 while the slot runs a job (its id is in comfysup status, never in a "
     "label).", _now(lambda slot: slot.get("job"))),
    (CounterMetricFamily, "comfysup_slot_jobs", "Attempts the slot's runners finished since the supervisor started.",
     _count("jobs")),
    (GaugeMetricFamily, "comfysup_slot_out_of_service", "1 while the slot takes no job because a prompt stayed in its "
     "server's queue after /interrupt (comfysup run: until the server is restarted; comfysup work: until its queue "
     "is empty); the prompt id is in comfysup status.", _now(lambda slot: slot.get("out_of_service"))),
    (GaugeMetricFamily, "comfysup_slot_stuck_restarts", "Restarts of the slot's ComfyUI server because a prompt did "
     "not leave its queue after /interrupt, since the supervisor started.", _count("stuck_restarts")),
    (GaugeMetricFamily, "comfysup_slot_server_malformed", "1 while the slot's server answers but its answers cannot "
     "be read (a malformed GET /queue): no job is claimed for it; the reason is in comfysup status.",
     _now(lambda slot: slot.get("problem"))),
)
"""What each slot shows: the family's type, name and help, and its value from the slot."""
MEMORY_ACTIONS = (*COUNTS, "idle_frees", "idle_restarts")
"""The slot state's memory recovery counts (comfysup.runner.memory, comfysup.supervisor.vram)."""
SLOT_READINESS: tuple[tuple[str, str, Callable[[dict[str, Any], bool], float | None]], ...] = (
    ("comfysup_slot_ready", "1 while the slot takes jobs (its server answers and, with [comfyui] warmup, is warm).",
     lambda slot, running: 1.0 if running and slot.get("ready") else 0.0),
    ("comfysup_slot_warmup_seconds", "How long the last warm-up of the slot's server took (absent before the first).",
     lambda slot, running: float(slot["warmup_seconds"]) if isinstance(slot.get("warmup_seconds"), int | float)
     else None),
    ("comfysup_slot_warmup_failures", "Warm-ups of the slot's server that failed (each a failed start) since the "
     "supervisor started.", lambda slot, running: float(slot.get("warmup_failures") or 0)),
)
"""The per-slot readiness gauges: name, help, the value from a slot of the state file (None: absent)."""


def _slot_readiness(slots: list[dict[str, Any]], running: bool) -> Iterable[Metric]:
    """SLOT_READINESS's gauges and the memory recoveries by action, for each slot of the state file."""
    keys = [[label(str(slot.get("name"))), label(str(slot.get("device")))] for slot in slots]
    for name, text, value in SLOT_READINESS:
        family = GaugeMetricFamily(name, text, labels=["slot", "device"])
        for key, slot in zip(keys, slots, strict=True):
            if (number := value(slot, running)) is not None:
                family.add_metric(key, number)
        yield family
    memory = GaugeMetricFamily("comfysup_slot_memory_recoveries", "Memory recoveries of the slot's server since the "
                               "supervisor started, by action: oom_frees (POST /free after an out-of-memory error), "
                               "oom_retries (the job run again uncounted), device_restarts (a lost device), "
                               "idle_frees and idle_restarts (VRAM held while idle, NVML).",
                               labels=["slot", "device", "action"])
    for key, slot in zip(keys, slots, strict=True):
        for action in MEMORY_ACTIONS:
            memory.add_metric([*key, action], float(slot.get(action) or 0))
    yield memory
"""The workflow label of every workflow past ``[metrics] max_workflow_labels``."""




def slot_metrics(slots: list[Slot], running: bool) -> Iterable[Metric]:
    """Every per-slot family for the state file's slots; ``running``: whether its supervisor is alive."""
    keys = [[label(str(slot.get("name"))), label(str(slot.get("device")))] for slot in slots]
    for family_type, name, text, value in SLOT_GAUGES:
        family = family_type(name, text, labels=["slot", "device"])
        for key, slot in zip(keys, slots, strict=True):
            family.add_metric(key, value(slot, running))
        yield family
    info = GaugeMetricFamily("comfysup_slot_comfyui_info", "1 for the ComfyUI version the slot's server reported "
                             "(/system_stats); version \"none\" until it answered.",
                             labels=["slot", "device", "version"])
    for key, slot in zip(keys, slots, strict=True):
        info.add_metric([*key, label(slot.get("comfyui_version"))[:40]], 1.0)
    yield info
    yield from _slot_readiness(slots, running)
