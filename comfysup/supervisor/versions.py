"""Which ComfyUI each slot's server runs: learnt from /system_stats and /features once it answers, kept on
the slot (the state file shows it to status, health, the status page and the metrics), and a warning, once
per version, when it is outside the tested range (comfysup.comfyversion)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from comfysup import comfyversion
from comfysup.comfy import ComfyClient, ComfyError

if TYPE_CHECKING:
    from comfysup.supervisor.children import Unit

log = logging.getLogger("comfysup.supervisor")
EXTERNAL_RETRY_SECONDS = 30.0
"""How often the version of a [[servers]] entry is asked for until it answers."""


class VersionWatch:
    def __init__(self, timeout_seconds: float = 1.0) -> None:
        self.timeout_seconds = timeout_seconds
        self.warned: set[str] = set()

    def learn(self, unit: Unit) -> None:
        """Ask the server (bounded: the main loop waits for it); a server that does not answer stays unknown."""
        client = ComfyClient(unit.url, timeout_seconds=self.timeout_seconds)
        try:
            client.system_stats()
            unit.comfyui_version = client.comfyui_version or "unknown"
            try:
                unit.features = client.features()
            except ComfyError:
                unit.features = {}  # 0.3.64 answers /features too; a server without it has none to tell
        except ComfyError:
            return
        finally:
            client.close()
        self.check(unit.name, unit.comfyui_version)

    def check(self, name: str, version: str | None) -> None:
        if version and version != "unknown" and not comfyversion.in_tested_range(version) \
                and version not in self.warned:
            self.warned.add(version)
            log.warning(comfyversion.untested_warning(name, version))

    def due(self, unit: Unit, now: float) -> bool:
        """An external server ([[servers]]) whose version is not known yet, at most every 30 s."""
        if unit.comfyui_version is not None or now < unit.next_version_check:
            return False
        unit.next_version_check = now + EXTERNAL_RETRY_SECONDS
        return True
