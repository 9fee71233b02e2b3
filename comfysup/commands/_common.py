"""What every command needs: the config from --config plus flags, the queue, and time formatting."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

from comfysup.config import Config, load_config
from comfysup.queue import Queue, open_queue


def config_from(args: argparse.Namespace, overrides: Mapping[str, Any] | None = None) -> Config:
    return load_config(getattr(args, "config", None), overrides=overrides)


def queue_from(config: Config, *, create: bool = False) -> Queue:
    return open_queue(config, create=create)


def age(seconds: float | None) -> str:
    """A duration a person reads at a glance: 850 ms, 12.3 s, 4 min 05 s, 3 h 12 min, 2 d 4 h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def object_info_path(config: Config) -> Any:
    """Where runners cache their server's /object_info, for submit's graph checks."""
    return config.resolve(config.queue.path).parent / "object_info.json"
