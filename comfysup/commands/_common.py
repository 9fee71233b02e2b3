"""What every command needs: the config from --config plus flags, and the queue."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from comfysup.config import Config, load_config
from comfysup.queue import Queue, open_queue


def config_from(args: argparse.Namespace, overrides: Mapping[str, Any] | None = None) -> Config:
    return load_config(getattr(args, "config", None), overrides=overrides)


def queue_from(config: Config, *, create: bool = False) -> Queue:
    return open_queue(config, create=create)

